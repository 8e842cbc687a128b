"""Every launcher's user errors (a bad config file, data file, checkpoint, workdir or flag)
are one line on stderr naming the file or flag, exit status 2, before any work (no warm
start in <workdir>/sft, nothing loaded).

`python tests/test_launcher_errors.py [--filter=TEXT]` prints, for every case of the table,
the lines of stderr, the exit status and the seconds it took (the figures of the issue).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROW = {"prompt": "1+2=", "answer": "3", "task": "arith"}
# The arith preset's smallest sizes, so that a case that did work would finish quickly.
SMALL = ("--config.model.hidden_size=16", "--config.model.num_layers=1",
         "--config.model.num_heads=2", "--config.sft.steps=1", "--config.train.steps=1")


def make_files(root: pathlib.Path) -> None:
  """The good and bad inputs the cases name, under `root`."""
  from rlhf_jax import models
  from rlhf_jax.tasks import arith
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=128), seed=0)
  good = root / "ckpt"
  models.save_policy(str(good), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  for name in ("truncated", "bad_config", "no_tokenizer"):
    subprocess.run(["cp", "-r", str(good), str(root / name)], check=True)
  weights = root / "truncated" / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-100])
  (root / "bad_config" / "config.json").write_text('{"model_type": "llama",')
  (root / "no_tokenizer" / "tokenizer.json").unlink()
  (root / "good.jsonl").write_text("\n".join(json.dumps(ROW) for _ in range(4)) + "\n")
  (root / "malformed.jsonl").write_text(json.dumps(ROW) + "\n{\"prompt\": \"1+\n")
  (root / "empty.jsonl").write_text("")
  (root / "columns.jsonl").write_text(json.dumps({"question": "1+2=", "solution": "3"}) + "\n")
  (root / "long.jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps(
      {**ROW, "prompt": "1+" * 3000 + "1="}) + "\n")
  (root / "config.txt").write_text("not python at all\n")
  (root / "syntax.py").write_text("def get_config(:\n  return None\n")
  (root / "a_file").write_text("not a directory\n")


# (case, launcher, arguments ({d}: the files' directory, {w}: a fresh workdir), text the
# error line must contain). The first of each launcher's rows are the cases of issue 34.
HF = ("--config=configs/grpo.py:hf", "--config.data.train_file={d}/good.jsonl",
      "--config.data.eval_file={d}/good.jsonl", "--workdir={w}")
ARITH = ("--config=configs/dapo.py:arith", "--workdir={w}", *SMALL)
EVAL = ("--checkpoint={d}/ckpt", "--data={d}/good.jsonl")
BON = ("--config=configs/grpo.py:arith", "--config.model.checkpoint={d}/ckpt", "--workdir={w}",
       "--config.data.eval_file={d}/good.jsonl", "--n=2")
CASES = [
    ("train: missing config file", "train.py",
     ("--config=configs/nope.py:arith", "--workdir={w}"), "configs/nope.py"),
    ("train: config file not Python", "train.py",
     ("--config={d}/config.txt", "--workdir={w}"), "config.txt"),
    ("train: config file syntax error", "train.py",
     ("--config={d}/syntax.py", "--workdir={w}"), "syntax.py"),
    ("train: malformed train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("train: empty train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/empty.jsonl"), "empty.jsonl"),
    ("train: wrong-column eval_file", "train.py",
     (*ARITH, "--config.data.eval_file={d}/columns.jsonl"), "columns.jsonl"),
    ("train: arith prompt too long", "train.py",
     (*ARITH, "--config.data.train_file={d}/long.jsonl"), "long.jsonl:2"),
    ("train: missing train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/nope.jsonl"), "nope.jsonl"),
    ("train: truncated safetensors", "train.py",
     (*HF, "--config.model.checkpoint={d}/truncated"), "model.safetensors"),
    ("train: bad config.json", "train.py",
     (*HF, "--config.model.checkpoint={d}/bad_config"), "config.json"),
    ("train: missing tokenizer", "train.py",
     (*HF, "--config.model.checkpoint={d}/no_tokenizer"), "tokenizer"),
    ("train: workdir is a file", "train.py",
     ("--config=configs/dapo.py:arith", "--workdir={d}/a_file"), "a_file"),
    ("eval: unknown flag", "eval.py", (*EVAL, "--sample=2"), "--sample"),
    ("eval: --samples=0", "eval.py", (*EVAL, "--samples=0"), "--samples=0"),
    ("eval: malformed --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("eval: empty --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/empty.jsonl"), "empty.jsonl"),
    ("eval: wrong-column --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/columns.jsonl"), "columns.jsonl"),
    ("eval: missing --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/nope.jsonl"), "nope.jsonl"),
    ("eval: prompt longer than the cache", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/long.jsonl"), "long.jsonl:2"),
    ("eval: truncated safetensors", "eval.py",
     ("--checkpoint={d}/truncated", "--data={d}/good.jsonl"), "model.safetensors"),
    ("eval: bad config.json", "eval.py",
     ("--checkpoint={d}/bad_config", "--data={d}/good.jsonl"), "config.json"),
    ("eval: missing tokenizer", "eval.py",
     ("--checkpoint={d}/no_tokenizer", "--data={d}/good.jsonl"), "tokenizer"),
    ("best_of_n: --prompts=-2", "best_of_n.py", (*BON, "--prompts=-2"), "--prompts"),
    ("best_of_n: missing config file", "best_of_n.py",
     ("--config=configs/nope.py:arith",), "configs/nope.py"),
    ("best_of_n: malformed eval_file", "best_of_n.py",
     (*BON, "--config.data.eval_file={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("best_of_n: truncated safetensors", "best_of_n.py",
     (*BON, "--config.model.checkpoint={d}/truncated"), "model.safetensors"),
    ("best_of_n: workdir is a file", "best_of_n.py",
     ("--config=configs/grpo.py:arith", "--workdir={d}/a_file"), "a_file"),
]


def run_case(launcher: str, arguments, files: pathlib.Path, workdir: pathlib.Path,
             timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
  """The launcher run in a fresh process on CPU; (its result, seconds)."""
  args = [a.format(d=files, w=workdir) for a in arguments]
  start = time.perf_counter()
  result = subprocess.run([sys.executable, f"launch/{launcher}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return result, time.perf_counter() - start


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("launcher_inputs")
  make_files(root)
  return root


@pytest.mark.slow
@pytest.mark.parametrize("case,launcher,arguments,names", CASES, ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_and_exit_2_before_any_work(case, launcher, arguments, names,
                                                            files, tmp_path):
  del case
  workdir = tmp_path / "work"
  result, _ = run_case(launcher, arguments, files, workdir, timeout=120)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
  assert names in lines[0]
  assert not (workdir / "sft").exists()  # no warm start before the error
  assert not result.stdout.strip()  # nothing ran that reports


def main(argv: list[str]) -> None:
  import tempfile
  only = next((a.split("=", 1)[1] for a in argv if a.startswith("--filter=")), "")
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    make_files(root / "files")
    print("| case | stderr lines | exit | seconds |\n|---|---|---|---|")
    for number, (case, launcher, arguments, _) in enumerate(CASES):
      if only not in case:
        continue
      result, seconds = run_case(launcher, arguments, root / "files", root / f"w{number}",
                                 timeout=300)
      lines = len([line for line in result.stderr.splitlines() if line.strip()])
      print(f"| {case} | {lines} | {result.returncode} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
