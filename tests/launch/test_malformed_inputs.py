"""The red team's malformed inputs of issue 41 (checkpoints, chat templates, data rows,
logs) through the launchers as a user runs them: each is one line on stderr naming the
file, exit status 2, in seconds, where they spun, aborted or gave tracebacks.

`python tests/launch/test_malformed_inputs.py [--filter=TEXT]` prints the table: every case,
its one line, the exit status and the seconds it took.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: tests.launch.* importable

from tests.launch.test_launcher_errors import make_files  # noqa: E402
from tests.launch.test_launcher_errors import run_case  # noqa: E402

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


def make_malformed(root: pathlib.Path) -> None:
  """The good files of test_launcher_errors and a malformed copy of each kind."""
  make_files(root)
  good = root / "ckpt"

  def copy(name: str) -> pathlib.Path:
    shutil.copytree(good, root / name)
    return root / name
  edit_json(copy("layers_10m") / "config.json", num_hidden_layers=10_000_000)
  edit_json(copy("rope_nan") / "config.json", rope_theta=float("nan"))
  edit_json(copy("wider_config") / "config.json", hidden_size=32)
  (copy("deep_config") / "config.json").write_text("[" * 100_000 + "]" * 100_000)
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
          ("pre-tokenizer regex backtracking", "backtracking_regex", "pre-tokenizer regex"))],
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
    ("rollouts.py: rollouts.jsonl with bytes not UTF-8", "rollouts.py",
     ("--workdir={d}/logs",), "rollouts.jsonl:2"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("malformed")
  make_malformed(root)
  return root


QUICK = ("serve.py: config.json num_hidden_layers=10000000",
         "train.py: chat template, loops", "train.py: data row of 50 MB")


@pytest.mark.parametrize("case,launcher,arguments,names", [
    pytest.param(*c, id=c[0], marks=() if c[0] in QUICK else pytest.mark.slow) for c in CASES])
def test_a_malformed_input_is_one_line_and_exit_2(case, launcher, arguments, names, files,
                                                 tmp_path):
  del case
  result, seconds = run_case(launcher, arguments, files, tmp_path / "work", timeout=120)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
  assert names in lines[0], lines[0]
  assert seconds < 60


def main(argv: list[str]) -> None:
  import tempfile
  only = next((a.split("=", 1)[1] for a in argv if a.startswith("--filter=")), "")
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    make_malformed(root / "files")
    print("| case | stderr (its lines: the last) | exit | seconds |\n|---|---|---|---|")
    for number, (case, launcher, arguments, _) in enumerate(CASES):
      if only not in case:
        continue
      try:
        result, seconds = run_case(launcher, arguments, root / "files", root / f"w{number}",
                                   timeout=300)
      except subprocess.TimeoutExpired:
        print(f"| {case} | - | killed | > 300 |", flush=True)
        continue
      lines = [line for line in result.stderr.splitlines() if line.strip()]
      last = (lines[-1] if lines else "").replace(str(root / "files"), "…").replace("|", "\\|")
      print(f"| {case} | ({len(lines)}) {last[:160]} | {result.returncode} | {seconds:.1f} |",
            flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
