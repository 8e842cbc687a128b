"""Every launcher's user errors (a bad config file, data file, checkpoint, workdir or flag)
are one line on stderr naming the file or flag, exit status 2, before any work (no warm
start in <workdir>/sft, nothing loaded).

`python tests/launch/test_launcher_errors.py [--filter=TEXT]` prints, for every case of the table,
the lines of stderr, the exit status and the seconds it took (the figures of the issue).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from rlhf_jax.cli import check_config_file
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models.hf.checks import check_checkpoint_dir
from rlhf_jax.models.hf.checks import check_safetensors
from rlhf_jax.training.run_control import check_workdir
from tests.launch.malformed import run_case

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
  (root / "task.jsonl").write_text(json.dumps({**ROW, "task": "bogus"}) + "\n")
  (root / "offline.jsonl").write_text(json.dumps({**ROW, "responses": ["3"], "scores": [1]})
                                      + "\n{\"prompt\": 1\n")
  (root / "syntax.py").write_text("def get_config(:\n  return None\n")
  (root / "name_error.py").write_text("def get_config(variant):\n  return undefined_name\n")
  (root / "a_file").write_text("not a directory\n")
  (root / "run").mkdir()
  (root / "run" / "metrics.jsonl").write_text('{"step": 0, "reward_mean": 1}\n{"step": 1,\n')


# (case, launcher, arguments ({d}: the files' directory, {w}: a fresh workdir), text the
# error line must contain).
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
    ("train: config file's code fails", "train.py",
     ("--config={d}/name_error.py:arith", "--workdir={w}"), "name_error.py:2: NameError"),
    ("train: malformed train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("train: arith prompt too long", "train.py",
     (*ARITH, "--config.data.train_file={d}/long.jsonl"), "long.jsonl:2"),
    ("train: malformed offline_file (dpo)", "train.py",
     ("--config=configs/dpo.py:arith", "--workdir={w}", *SMALL,
      "--config.data.offline_file={d}/offline.jsonl"), "offline.jsonl:2"),
    ("train: truncated safetensors", "train.py",
     (*HF, "--config.model.checkpoint={d}/truncated"), "model.safetensors"),
    ("train: bad config.json", "train.py",
     (*HF, "--config.model.checkpoint={d}/bad_config"), "config.json"),
    ("train: missing tokenizer", "train.py",
     (*HF, "--config.model.checkpoint={d}/no_tokenizer"), "tokenizer"),
    ("train: truncated reward model", "train.py",
     ("--config=configs/ppo.py:arith", "--workdir={w}", *SMALL, "--config.reward.route=rm",
      "--config.reward.rm.checkpoint={d}/truncated"), "config.reward.rm.checkpoint"),
    ("train: workdir is a file", "train.py",
     ("--config=configs/dapo.py:arith", "--workdir={d}/a_file"), "a_file"),
    ("eval: unknown flag", "eval.py", (*EVAL, "--sample=2"), "flag 'sample'"),
    ("eval: --samples=0", "eval.py", (*EVAL, "--samples=0"), "--samples=0"),
    ("eval: malformed --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("eval: empty --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/empty.jsonl"), "empty.jsonl"),
    ("eval: wrong-column --data", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/columns.jsonl"), "columns.jsonl"),
    ("eval: a task without a scorer", "eval.py",
     ("--checkpoint={d}/ckpt", "--data={d}/task.jsonl"), "task.jsonl:1"),
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
    ("best_of_n: truncated safetensors", "best_of_n.py",
     (*BON, "--config.model.checkpoint={d}/truncated"), "model.safetensors"),
    ("best_of_n: workdir is a file", "best_of_n.py",
     ("--config=configs/grpo.py:arith", "--workdir={d}/a_file"), "a_file"),
    ("plot: malformed metrics.jsonl", "plot.py", ("--workdir={d}/run",), "metrics.jsonl:2"),
    ("sft: malformed eval_file (arith)", "sft.py",
     ("--config=configs/sft.py:arith", "--workdir={w}", *SMALL,
      "--config.data.eval_file={d}/malformed.jsonl"), "malformed.jsonl:2"),
    ("qsharp: --bon_n=x", "qsharp.py",
     ("--config=configs/grpo.py:arith", "--workdir={w}", "--bon_n=4,x"), "--bon_n=4,x"),
    ("sweep: unknown flag", "sweep.py", ("--arms=a",), "flag 'arms'"),
    ("train_rm: truncated --policy", "train_rm.py",
     ("--policy={d}/truncated", "--output={w}/rm"), "model.safetensors"),
]
# Cases that were always one line, or repeat another launcher's: measured by main(), not
# run by the test.
EXTRA = [
    ("train: empty train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/empty.jsonl"), "empty.jsonl"),
    ("train: wrong-column eval_file", "train.py",
     (*ARITH, "--config.data.eval_file={d}/columns.jsonl"), "columns.jsonl"),
    ("train: missing train_file", "train.py",
     (*ARITH, "--config.data.train_file={d}/nope.jsonl"), "nope.jsonl"),
    ("best_of_n: missing config file", "best_of_n.py",
     ("--config=configs/nope.py:arith",), "configs/nope.py"),
    ("best_of_n: malformed eval_file", "best_of_n.py",
     (*BON, "--config.data.eval_file={d}/malformed.jsonl"), "malformed.jsonl:2"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("launcher_inputs")
  make_files(root)
  return root


# The quick subset (-m "not slow") runs one case of each kind, ~2 s of CPU per fresh process
# (train.py's malformed data: test_malformed_inputs.py's quick row of 50 MB); the suite
# runs them all.
QUICK = ("train: config file's code fails", "train: truncated safetensors",
         "eval: unknown flag", "eval: malformed --data", "best_of_n: --prompts=-2")
assert set(QUICK) <= {case[0] for case in CASES}, "a quick case that is not in the table"


@pytest.mark.parametrize("case,launcher,arguments,names", [
    pytest.param(*c, id=c[0], marks=() if c[0] in QUICK else pytest.mark.slow)
    for c in CASES])
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


def test_a_workdir_in_use_is_refused_before_the_warm_start(files, tmp_path):
  from rlhf_jax.training import run_control
  held = run_control.WorkdirLock(str(tmp_path / "work"))
  held.acquire()  # another trainer's, as far as the launcher can tell
  try:
    result, _ = run_case("train.py", ARITH, files, tmp_path / "work", timeout=120)
  finally:
    held.release()
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(lines) == 1 and "in use by another trainer" in lines[0], result.stderr[-3000:]
  assert not (tmp_path / "work" / "sft").exists()  # the lock came before the warm start


def test_the_loaders_name_the_file_they_cannot_read(files, tmp_path):
  from rlhf_jax import models
  with pytest.raises(ValueError, match=f"^{files}/truncated/model.safetensors: not a readable"):
    models.load_hf_checkpoint(str(files / "truncated"))
  with pytest.raises(ValueError, match=f"^{files}/bad_config/config.json:1: not JSON"):
    models.load_hf_checkpoint(str(files / "bad_config"))
  subprocess.run(["cp", "-r", str(files / "ckpt"), str(tmp_path / "ckpt")], check=True)
  (tmp_path / "ckpt" / "tokenizer.json").write_text("{")
  with pytest.raises(ValueError, match=f"^{tmp_path}/ckpt/tokenizer.json: not a readable"):
    models.Tokenizer.from_directory(str(tmp_path / "ckpt"))


def write_safetensors(path: pathlib.Path) -> None:
  from safetensors.numpy import save_file
  save_file({"a": np.zeros((3, 4), np.float32), "b": np.ones(5, np.int32)}, str(path))


def test_a_safetensors_file_is_checked_by_its_header_and_size(tmp_path):
  path = tmp_path / "model.safetensors"
  write_safetensors(path)
  assert check_safetensors(str(path), "x") == {"a", "b"}
  whole = path.read_bytes()
  for cut, message in ((whole[:-1], "truncated"), (whole + b"\0", "padded"),
                       (whole[:6], "not a safetensors file"),
                       (b"\xff" * 8 + whole[8:], "not a safetensors file"),
                       (whole[:8] + b"[" + whole[9:], "header is not a JSON object")):
    path.write_bytes(cut)
    with pytest.raises(ConfigError, match=f"^x: {path}: .*{message}"):
      check_safetensors(str(path), "x")


def test_a_checkpoint_dir_needs_its_config_weights_shards_and_tokenizer(tmp_path):
  directory = tmp_path / "ckpt"
  directory.mkdir()
  where = "--checkpoint=ckpt"
  with pytest.raises(ConfigError, match="has no config.json"):
    check_checkpoint_dir(str(directory), where)
  (directory / "config.json").write_text("[1]")
  with pytest.raises(ConfigError, match="config.json is not a JSON object"):
    check_checkpoint_dir(str(directory), where)
  (directory / "config.json").write_text("{}")
  with pytest.raises(ConfigError, match="has no model.safetensors"):
    check_checkpoint_dir(str(directory), where)
  (directory / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
  write_safetensors(directory / "model-1.safetensors")
  with pytest.raises(ConfigError, match="shard .*model-2.safetensors.* is missing"):
    check_checkpoint_dir(str(directory), where)
  write_safetensors(directory / "model-2.safetensors")
  check_checkpoint_dir(str(directory), where, tokenizer=False)
  with pytest.raises(ConfigError, match=f"^{where}: .* has no tokenizer.json"):
    check_checkpoint_dir(str(directory), where)
  (directory / "tokenizer.json").write_text("{")
  with pytest.raises(ConfigError, match="tokenizer.json:1: not JSON"):
    check_checkpoint_dir(str(directory), where)
  (directory / "tokenizer.json").write_text("{}")
  check_checkpoint_dir(str(directory), where)
  with pytest.raises(ConfigError, match="no such directory"):
    check_checkpoint_dir(str(tmp_path / "nope"), where)
  with pytest.raises(ConfigError, match="not a directory"):
    check_checkpoint_dir(str(directory / "config.json"), where)


def test_a_config_file_exists_is_python_and_compiles(tmp_path):
  (tmp_path / "c.py").write_text("def get_config(variant):\n  return variant\n")
  check_config_file(f"{tmp_path}/c.py:arith")
  with pytest.raises(ConfigError, match="no such file"):
    check_config_file(f"{tmp_path}/d.py:arith")
  with pytest.raises(ConfigError, match="is a directory"):
    check_config_file(str(tmp_path))
  (tmp_path / "c.yaml").write_text("a: 1\n")
  with pytest.raises(ConfigError, match="not a Python config file"):
    check_config_file(f"{tmp_path}/c.yaml")
  (tmp_path / "e.py").write_text("x = 1\ndef get_config(:\n")
  with pytest.raises(ConfigError, match=f"^--config={tmp_path}/e.py: {tmp_path}/e.py:2: syntax"):
    check_config_file(f"{tmp_path}/e.py")


def test_a_workdir_is_a_directory_or_can_become_one(tmp_path):
  check_workdir(str(tmp_path))
  check_workdir(str(tmp_path / "new" / "deeper"))
  (tmp_path / "file").write_text("")
  with pytest.raises(ConfigError, match=f"{tmp_path}/file is a file, not a directory$"):
    check_workdir(str(tmp_path / "file"))
  with pytest.raises(ConfigError, match="is a file, not a directory .on the way to"):
    check_workdir(str(tmp_path / "file" / "run"))


def test_a_server_s_unreadable_tokenizer_names_its_field(tmp_path):
  """launch/serve.py's checks: the field in the message and in `.field`. In a process of
  its own: importing a launcher defines its absl flags (a required --config among them) in
  the process's global FLAGS, which would break every later `cli.run` of this worker."""
  (tmp_path / "tokenizer.json").write_text("{}")  # JSON, but no tokenizer
  script = f"""
import sys
sys.path.insert(0, {str(ROOT / "launch")!r})
import ml_collections
import serve
from rlhf_jax.config_errors import ConfigError
config = ml_collections.ConfigDict(dict(tokenizer={str(tmp_path)!r},
                                        model=dict(kind="arith", checkpoint="")))
try:
  serve.check_served_files(config)
except ConfigError as error:
  print(error.field)
  print(error)
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  field, message = result.stdout.strip().splitlines()[:2]
  assert field == "tokenizer"
  assert message.startswith(f"config.tokenizer: {tmp_path}: the tokenizer does not load: ")


def main(argv: list[str]) -> None:
  import tempfile
  only = next((a.split("=", 1)[1] for a in argv if a.startswith("--filter=")), "")
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    make_files(root / "files")
    print("| case | stderr lines | exit | seconds |\n|---|---|---|---|")
    for number, (case, launcher, arguments, _) in enumerate(CASES + EXTRA):
      if only not in case:
        continue
      try:
        result, seconds = run_case(launcher, arguments, root / "files", root / f"w{number}",
                                   timeout=600)
      except subprocess.TimeoutExpired:
        print(f"| {case} | - | killed | > 600 |", flush=True)
        continue
      lines = len([line for line in result.stderr.splitlines() if line.strip()])
      print(f"| {case} | {lines} | {result.returncode} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
