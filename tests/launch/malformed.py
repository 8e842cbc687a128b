"""The red team's malformed inputs (checkpoints, chat templates, data rows,
logs) and how a launcher is run on them: shared by tests/launch/test_malformed_inputs.py
(the table) and the adversarial suite (tests/sandbox/test_input_bounds_adversarial.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = {"prompt": "1+2=", "answer": "3", "task": "arith"}
CHAT_ROW = {"prompt": [{"role": "user", "content": "1+2="}], "answer": "3", "task": "arith"}
# Templates of the red team: unbounded size, unbounded recursion, loops with no end in sight.
TEMPLATES = {"template_size": "{{ 'a' * 3000000000 }}",
             "template_recursion": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
             "template_loops": "{% for i in range(60000) %}{% for j in range(60000) %}"
                               "{% endfor %}{% endfor %}"}


def edit_json(path: pathlib.Path, **changes) -> None:
  value = json.loads(path.read_text())
  value.update(changes)
  path.write_text(json.dumps(value))


def forge_header(path: pathlib.Path, tensor: str, **changes) -> None:
  """Rewrites one tensor's entry of a safetensors header, keeping the file's data."""
  data = path.read_bytes()
  length = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + length])
  header[tensor].update(changes)
  text = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


def make_good(root: pathlib.Path) -> None:
  """A 1-layer arith policy saved as an HF checkpoint (root/ckpt) and a prompt file."""
  from rlhf_jax import models
  from rlhf_jax.tasks import arith
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=128), seed=0)
  models.save_policy(str(root / "ckpt"), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  (root / "good.jsonl").write_text("\n".join(json.dumps(ROW) for _ in range(4)) + "\n")


def make_malformed(root: pathlib.Path) -> None:
  """The good files (`make_good`) and a malformed copy of each kind."""
  make_good(root)
  good = root / "ckpt"

  def copy(name: str) -> pathlib.Path:
    shutil.copytree(good, root / name)
    return root / name
  edit_json(copy("layers_10m") / "config.json", num_hidden_layers=10_000_000)
  edit_json(copy("rope_nan") / "config.json", rope_theta=float("nan"))
  edit_json(copy("wider_config") / "config.json", hidden_size=32)
  (copy("deep_config") / "config.json").write_text("[" * 100_000 + "]" * 100_000)
  (copy("deep_tokenizer_config") / "tokenizer_config.json").write_text(
      '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
  embed = "model.embed_tokens.weight"
  forge_header(copy("negative_shape") / "model.safetensors", embed, shape=[-1, 16])
  forge_header(copy("huge_shape") / "model.safetensors", embed, shape=[1 << 40, 1 << 40])
  forge_header(copy("unknown_dtype") / "model.safetensors", embed, dtype="F128")
  tokenizer = copy("big_tokenizer") / "tokenizer.json"
  rows = json.loads((good / "config.json").read_text())["vocab_size"]
  value = json.loads(tokenizer.read_text())
  value["added_tokens"].append({"id": rows + 2_000_000, "content": "<|extra|>", "lstrip": False,
                                "single_word": False, "rstrip": False, "normalized": False,
                                "special": True})
  tokenizer.write_text(json.dumps(value))
  tokenizer = copy("backtracking_regex") / "tokenizer.json"
  value = json.loads(tokenizer.read_text())
  value["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": r"(\w+\s?)+$"},
                            "behavior": "Isolated", "invert": False}
  tokenizer.write_text(json.dumps(value))
  for name, template in TEMPLATES.items():
    edit_json(copy(name) / "tokenizer_config.json", chat_template=template)
  (root / "chat.jsonl").write_text(json.dumps(CHAT_ROW) + "\n")
  (root / "big_row.jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps(
      {**ROW, "prompt": "1+" * 25_000_000 + "1="}) + "\n")
  conversation = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
  (root / "sft_big.jsonl").write_text(json.dumps({"messages": conversation}) + "\n" + json.dumps(
      {"messages": [{"role": "user", "content": "1+" * 25_000_000}, conversation[1]]}) + "\n")
  (root / "bad_utf8.jsonl").write_bytes(json.dumps(ROW).encode() + b"\n"
                                        + b'{"prompt": "1+2=\xff", "answer": "3"}\n')
  (root / "deep.jsonl").write_text(json.dumps(ROW) + "\n" + '{"prompt": '
                                   + "[" * 100_000 + "]" * 100_000 + "}\n")
  (root / "nan_answer.jsonl").write_text(json.dumps(ROW) + "\n"
                                         + '{"prompt": "1+2=", "answer": NaN, "task": "arith"}\n')
  (root / "logs").mkdir()
  (root / "logs" / "rollouts.jsonl").write_bytes(
      b'{"step": 1, "reward": 1.0, "turns": [], "loss_mask": [], "token_ids": []}\n'
      b"\xc3\x28\n")


HF = ("--config=configs/grpo.py:hf", "--config.data.train_file={d}/good.jsonl",
      "--config.data.eval_file={d}/good.jsonl", "--workdir={w}", "--validate_only")
SERVE = ("--config=configs/serve.py:hf", "--config.server.port=0")
SFT = ("--config=configs/sft.py:hf", "--workdir={w}", "--config.sft.train_file={d}/good.jsonl",
       "--validate_only")
EVAL = ("--data={d}/good.jsonl",)
# (case, launcher, arguments ({d}: the files, {w}: a fresh workdir), text the line names)
CASES = [
    *[(f"{launcher}: {what}", launcher, (*args, f"{flag}={{d}}/{name}"), text)
      for launcher, args, flag in (("train.py", HF, "--config.model.checkpoint"),
                                   ("serve.py", SERVE, "--config.model.checkpoint"),
                                   ("sft.py", SFT, "--config.model.checkpoint"),
                                   ("eval.py", EVAL, "--checkpoint"))
      for what, name, text in (
          ("config.json num_hidden_layers=10000000", "layers_10m", "num_hidden_layers=10000000"),
          ("config.json rope_theta NaN", "rope_nan", "rope_theta=nan must be finite"),
          ("config.json hidden_size unlike the tensors", "wider_config", "does not fit tensor"),
          ("config.json nested 100000 deep", "deep_config", "nested too deeply"),
          ("safetensors negative shape", "negative_shape", "no sound dtype, shape"),
          ("safetensors 2^80-element shape", "huge_shape", "needs"),
          ("safetensors dtype F128", "unknown_dtype", "dtype 'F128'"),
          ("tokenizer 2,000,000 ids past the embedding", "big_tokenizer", "token ids, more"),
          ("pre-tokenizer regex backtracking", "backtracking_regex", "pre-tokenizer regex"),
          ("tokenizer_config.json nested 100000 deep", "deep_tokenizer_config",
           "tokenizer_config.json: JSON nested too deeply"))],
    *[(f"train.py: chat template, {name.split('_')[1]}", "train.py",
       ("--config=configs/grpo.py:hf", "--config.data.train_file={d}/chat.jsonl",
        "--config.data.eval_file={d}/chat.jsonl", "--workdir={w}", "--validate_only",
        "--config.data.template_timeout_s=3", f"--config.model.checkpoint={{d}}/{name}"),
       "tokenizer_config.json: the chat template") for name in TEMPLATES],
    *[(f"train.py: data row {what}", "train.py",
       (*HF, "--config.model.checkpoint={d}/ckpt", f"--config.data.train_file={{d}}/{name}"),
       f"{name}:2") for what, name in (("of 50 MB", "big_row.jsonl"),
                                        ("with bytes not UTF-8", "bad_utf8.jsonl"),
                                        ("nested 100000 deep", "deep.jsonl"),
                                        ("with answer NaN", "nan_answer.jsonl"))],
    ("sft.py: conversation of 50 MB", "sft.py",
     ("--config=configs/sft.py:hf", "--workdir={w}", "--config.model.checkpoint={d}/ckpt",
      "--config.sft.train_file={d}/sft_big.jsonl", "--validate_only"), "sft_big.jsonl:2"),
    ("rollouts.py: rollouts.jsonl with bytes not UTF-8", "rollouts.py",
     ("--workdir={d}/logs",), "rollouts.jsonl:2"),
]


def run_case(launcher: str, arguments, files: pathlib.Path, workdir: pathlib.Path,
             timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
  """launch/<launcher> with `arguments` ({d}: `files`, {w}: `workdir`) in a fresh process
  on CPU; (its result, seconds)."""
  args = [a.format(d=files, w=workdir) for a in arguments]
  start = time.perf_counter()
  result = subprocess.run([sys.executable, f"launch/{launcher}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return result, time.perf_counter() - start
