"""`--validate_only` on every launcher that does work: the flags, config and input files
are checked and the launcher exits with "config ok" (status 0) before anything loads,
trains or is written; an error is the one line of any other run (status 2).
(launch/eval.py's is tested with eval.py; train.py's in test_launcher_errors.py too.)"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.launch.runs import run

ROW = {"prompt": "1+2=", "answer": "3", "task": "arith"}
# The arith preset's smallest sizes, so that a case that did work would finish quickly.
SMALL = ("--config.model.hidden_size=16", "--config.model.num_layers=1",
         "--config.model.num_heads=2", "--config.sft.steps=1", "--config.train.steps=1")
CHECKPOINT = ("--config.model.checkpoint={d}/ckpt",)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """The inputs the cases name: a tiny arith checkpoint (whole, truncated, without its
  tokenizer), prompts and preference pairs (well-formed, and a torn second row)."""
  from rlhf_jax import models
  from rlhf_jax.tasks import arith
  root = tmp_path_factory.mktemp("validate_only_inputs")
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=128), seed=0)
  models.save_policy(str(root / "ckpt"), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  for name in ("truncated", "no_tokenizer"):
    shutil.copytree(root / "ckpt", root / name)
  weights = root / "truncated" / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-100])
  (root / "no_tokenizer" / "tokenizer.json").unlink()
  (root / "good.jsonl").write_text("".join(json.dumps(ROW) + "\n" for _ in range(4)))
  (root / "malformed.jsonl").write_text(json.dumps(ROW) + "\n{\"prompt\": \"1+\n")
  (root / "pairs.jsonl").write_text(
      json.dumps({"prompt": "1+2=", "chosen": "3", "rejected": "4"}) + "\n")
  return root


def run_case(launcher: str, arguments, files, workdir):
  """The launcher in a fresh process on CPU, {d} and {w} in `arguments` filled in."""
  return run(launcher, *[a.format(d=files, w=workdir) for a in arguments], timeout=120)
# (launcher, arguments: {d} the inputs of test_launcher_errors.make_files, {w} a fresh
# directory that must stay absent; an argument that makes it an error, and its text)
BAD_FIELD = ("--config.rollout.temperature=-1", "config.rollout.temperature")
BAD_POLICY = ("--policy={d}/truncated", "model.safetensors")
LAUNCHERS = [
    ("train.py", ("--config=configs/grpo.py:arith", "--workdir={w}", *SMALL), BAD_FIELD),
    ("sft.py", ("--config=configs/sft.py:arith", "--workdir={w}", *SMALL), BAD_FIELD),
    ("serve.py", ("--config=configs/serve.py:tiny",),
     ("--config.server.port=70000", "config.server.port")),
    ("train_rm.py", ("--policy={d}/ckpt", "--output={w}", "--train_pairs={d}/pairs.jsonl"),
     BAD_POLICY),
    ("train_prm.py", ("--policy={d}/ckpt", "--output={w}", "--prompts={d}/good.jsonl"),
     ("--prompts={d}/malformed.jsonl", "malformed.jsonl:2")),
    ("train_judge.py", ("--kind=genrm", "--policy={d}/ckpt", "--output={w}",
                        "--num_examples=8"), BAD_POLICY),
    ("best_of_n.py", ("--config=configs/grpo.py:arith", *CHECKPOINT, "--workdir={w}",
                      "--config.data.eval_file={d}/good.jsonl"),
     ("--config.data.eval_file={d}/malformed.jsonl", "malformed.jsonl:2")),
    ("qsharp.py", ("--config=configs/grpo.py:arith", *CHECKPOINT, "--workdir={w}"), BAD_FIELD),
    ("label_samples.py", ("--config=configs/dpo.py:arith", *CHECKPOINT,
                          "--output={w}/labelled.jsonl"), BAD_FIELD),
    ("select_prompts.py", ("--config=configs/grpo.py:arith", *CHECKPOINT,
                           "--output={w}/selected.jsonl"),
     ("--config.model.checkpoint={d}/truncated", "model.safetensors")),
    ("make_references.py", ("--config=configs/grpo.py:arith", *CHECKPOINT, "--rm={d}/ckpt",
                            "--output={w}/references.jsonl"),
     ("--rm={d}/no_tokenizer", "tokenizer")),
]


@pytest.mark.slow
@pytest.mark.parametrize("launcher, arguments, bad", LAUNCHERS, ids=[l[0] for l in LAUNCHERS])
def test_validate_only_checks_and_exits_before_any_work(launcher, arguments, bad, files,
                                                       tmp_path):
  workdir = tmp_path / "work"
  result = run_case(launcher, (*arguments, "--validate_only"), files, workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == "config ok", result.stdout[-3000:]
  assert not workdir.exists()  # nothing written, no warm start
  argument, names = bad
  result = run_case(launcher, (*arguments, argument, "--validate_only"), files, workdir)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith("error: ") and names in lines[0], lines
  assert "config ok" not in result.stdout and not workdir.exists()
