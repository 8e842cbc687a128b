"""launch/eval.py against train.py: the same config, checkpoint and settings give train.py's
held-out figures, greedy and sampled (fresh processes, flags only; the checkpoint and data
of the bring-your-own tests: tests/launch/byo_files.py)."""

import json

import pytest

from tests.launch.runs import run
from tests.launch.byo_files import MESSAGES
from tests.launch.byo_files import TINY
from tests.launch.byo_files import family_checkpoint
from tests.launch.byo_files import trl_file


def json_lines(stdout: str) -> list[dict]:
  """The JSON lines of a launcher's output (eval.py ends with a markdown table)."""
  return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def even_length(prompts, completions, **kwargs):
  """A reward function in TRL's signature that a random policy meets about half the time
  (full marks = correct): 1.0 for a completion of an even number of characters."""
  return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]


@pytest.mark.slow
def test_eval_gives_train_held_out_figures_on_the_same_checkpoint(tmp_path):
  # The case: a Qwen3 checkpoint, a TRL conversational file with a task no
  # verifier knows, scored by a reward function; eval.py takes train.py's flags.
  checkpoint = family_checkpoint(tmp_path / "qwen3", "qwen3")
  rows = [{"prompt": [MESSAGES[0], {"role": "user", "content": f"Name colour {i}."}],
           "solution": "red"} for i in range(6)]
  data = trl_file(tmp_path / "colours.jsonl", rows)
  config = ["--config=configs/grpo.py:hf", f"--config.model.checkpoint={checkpoint}",
            f"--config.data.train_file={data}", f"--config.data.eval_file={data}",
            "--config.data.columns=answer=solution", "--config.data.default_task=colours",
            f"--config.reward.function={__name__}:even_length", *TINY,
            "--config.train.steps=1", "--config.train.eval_every=1",
            "--config.train.eval_samples=4"]
  result = run("train.py", *config, f"--workdir={tmp_path / 'run'}")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  records = [json.loads(line)
             for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  last = [r for r in records if "eval_accuracy" in r][-1]
  assert last["step"] == summary["steps"] == 1
  # The trainer's sampled evaluation: rollout.temperature (1.0), seed + 7919 (step + 1).
  # --compare: the checkpoint before RL on the same problems, paired.
  result = run("eval.py", *config, f"--checkpoint={summary['policy']}", "--samples=4",
               "--temperature=1.0", f"--seed={7919 * 2}", f"--output={tmp_path / 'eval.json'}",
               f"--compare={checkpoint}")
  assert result.returncode == 0, result.stderr[-3000:]
  report, before, compared = json_lines(result.stdout)
  assert [report, before, compared] == json.loads((tmp_path / "eval.json").read_text())
  assert before["checkpoint"] == compared["compare"] == checkpoint
  for name in ("avg@4", "pass@2", "greedy_accuracy"):
    difference = compared["difference"][name]
    assert difference["value"] == pytest.approx(before[name] - report[name])
    assert difference["low"] <= difference["value"] <= difference["high"]
  assert report["prompts"] == 6 and report["data"] == data
  # Greedy: accuracy, response length and no-answer rate are train.py's, to the bit.
  assert report["greedy_accuracy"] == last["eval_accuracy"]
  assert report["greedy_response_length"] == last["eval_response_length"]
  assert report["greedy_no_answer_rate"] == last["eval/no_answer_rate"]
  # Sampled: avg@4 and every pass@k.
  assert report["accuracy"] == report["avg@4"] == last["eval_sampled_accuracy"]
  assert 0 < report["avg@4"] < 1  # the comparison can fail: the verdicts vary
  for k in (1, 2, 4):
    assert report[f"pass@{k}"] == last[f"eval_pass@{k}"]
  interval = report["interval"]["avg@4"]
  assert interval["low"] <= interval["value"] == report["avg@4"] <= interval["high"]
  assert "| 95 % intervals |" in result.stdout and f"| {checkpoint} − " in result.stdout


@pytest.mark.slow
def test_eval_validate_only_checks_and_refuses_in_one_line(tmp_path):
  checkpoint = family_checkpoint(tmp_path / "qwen3", "qwen3")
  data = trl_file(tmp_path / "colours.jsonl", [{"prompt": MESSAGES, "solution": "red"}])
  config = ["--config=configs/grpo.py:hf", "--config.data.columns=answer=solution",
            "--config.data.default_task=colours",
            f"--config.reward.function={__name__}:even_length", *TINY,
            f"--checkpoint={checkpoint}", "--validate_only"]
  result = run("eval.py", *config, f"--data={data}")
  assert result.returncode == 0 and result.stdout.strip() == "config ok", result.stderr
  for extra, line in (
      ((), "error: config.data.eval_file: empty: eval.py evaluates held-out rows "
           "(--config.data.eval_file=FILE or --data=FILE)"),
      ((f"--data={data}", "--max_new_tokens=8"),
       "error: --max_new_tokens: not with --config; set --config.rollout.max_new_tokens "
       "(the field train.py reads)"),
      ((f"--data={data}", "--config.data.default_task="),
       f"error: config.data.eval_file: {data}:1: field 'task': no column 'task'"),
  ):
    result = run("eval.py", *config, *extra)
    assert result.returncode == 2 and not result.stdout, result.stderr
    assert result.stderr.strip().splitlines() == [line] or (
        result.stderr.strip().startswith(line) and len(result.stderr.strip().splitlines()) == 1
    ), result.stderr
