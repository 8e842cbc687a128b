"""`--validate_only` on every launcher that does work: the flags, config and input files
are checked and the launcher exits with "config ok" (status 0) before anything loads,
trains or is written; an error is the one line of any other run (status 2).
(launch/eval.py's is tested with eval.py; train.py's in test_launcher_errors.py too.)"""

from __future__ import annotations

import pytest

from tests.launch.test_launcher_errors import SMALL
from tests.launch.test_launcher_errors import files  # pylint: disable=unused-import  # fixture
from tests.launch.test_launcher_errors import run_case

CHECKPOINT = ("--config.model.checkpoint={d}/ckpt",)
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
  (files / "pairs.jsonl").write_text('{"prompt": "1+2=", "chosen": "3", "rejected": "4"}\n' * 4)
  workdir = tmp_path / "work"
  result, _ = run_case(launcher, (*arguments, "--validate_only"), files, workdir, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == "config ok", result.stdout[-3000:]
  assert not workdir.exists()  # nothing written, no warm start
  argument, names = bad
  result, _ = run_case(launcher, (*arguments, argument, "--validate_only"), files, workdir,
                       timeout=120)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith("error: ") and names in lines[0], lines
  assert "config ok" not in result.stdout and not workdir.exists()
