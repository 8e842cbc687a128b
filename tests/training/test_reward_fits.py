"""The reward fits' inputs (training/reward_fits.py), before any training: the held-out split,
the launchers' flag files as one error naming the flag, judged responses read row by row,
and a judge's questions and verdicts from files or the built-in task's data. (The fits
themselves: tests/rewards/test_reward_launchers.py, end to end.)"""

from __future__ import annotations

import json

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import PreferencePair
from rlhf_jax.data import write_pairs
from rlhf_jax.training import reward_fits


def test_the_held_out_split():
  assert reward_fits.split_held_out(range(10), None, 0.2) == ([0, 1, 2, 3, 4, 5, 6, 7], [8, 9])
  assert reward_fits.split_held_out([1, 2, 3], None, 0.01) == ([1, 2], [3])  # at least one
  assert reward_fits.split_held_out([1, 2], [9], 0.5) == ([1, 2], [9])
  with pytest.raises(ValueError, match="1 items are too few to hold out 50%"):
    reward_fits.split_held_out([1], None, 0.5)


def judged_file(path, *records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def test_judged_rows_and_their_errors(tmp_path):
  good = {"prompt": "1+1?", "answer": "2", "response": "Answer: 2", "correct": True,
          "task": "arith", "metadata": {"reference": "Answer: 2"}}
  untasked = {k: v for k, v in good.items() if k not in ("task", "metadata")}
  path = judged_file(tmp_path / "judged.jsonl", good, dict(untasked, correct=False))
  (example, response, correct), (other, _, wrong) = reward_fits.read_judged(path)
  assert (example.prompt, example.answer, example.task, response, correct) == (
      "1+1?", "2", "arith", "Answer: 2", True)
  assert example.metadata == {"reference": "Answer: 2"} and not wrong
  assert other.task == "" and other.metadata == {}
  bad = judged_file(tmp_path / "bad.jsonl", good, dict(good, correct="yes"))
  with pytest.raises(ConfigError, match=rf"^--judged={bad}: {bad}:2: field 'correct' must be "
                                        r"bool"):
    reward_fits.read_flag_file("judged", reward_fits.read_judged, bad)
  with pytest.raises(ConfigError, match=rf"^--judged={tmp_path}/none.jsonl: "):
    reward_fits.read_flag_file("judged", reward_fits.read_judged, f"{tmp_path}/none.jsonl")


def test_a_judges_questions_from_files_or_generated(tmp_path):
  with pytest.raises(ConfigError, match=r"^--kind='judge': must be one of genrm, "
                                        r"genrm_reference, pairwise"):
    reward_fits.judge_questions("judge")
  judged = judged_file(tmp_path / "judged.jsonl",
                       {"prompt": "1+1?", "answer": "2", "response": "Answer: 2", "correct": True},
                       {"prompt": "2+2?", "answer": "4", "response": "Answer: 5", "correct": False})
  questions, verdicts = reward_fits.judge_questions("genrm", judged=judged)
  assert verdicts == ("Y", "N") and [v for _, v in questions] == ["Y", "N"]
  assert "Answer: 5" in questions[1][0]
  pairs = str(tmp_path / "pairs.jsonl")
  write_pairs(pairs, [PreferencePair("1+1?", "Answer: 2", "Answer: 3")])
  questions, verdicts = reward_fits.judge_questions("pairwise", pairs=pairs)
  assert verdicts == ("A", "B") and len(questions) >= 1
  assert all(v in ("A", "B") for _, v in questions)
  generated, _ = reward_fits.judge_questions("genrm", num_examples=20, seed=0)
  assert len(generated) == 20 and {v for _, v in generated} == {"Y", "N"}


def test_the_policy_and_output_flags(tmp_path):
  with pytest.raises(ConfigError, match=rf"--policy={tmp_path}/none"):
    reward_fits.check_policy_and_output(f"{tmp_path}/none", str(tmp_path / "out"))
