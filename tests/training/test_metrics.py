"""Step metrics (training/metrics.py): the rollout's lengths split by verdict over finished rows,
and rollouts.jsonl, where a single-turn row is its prompt and response without padding,
trained on where the response is; resumed runs drop later steps."""

import json

import numpy as np

from rlhf_jax import batch as batch_lib
from rlhf_jax.analysis.rollouts import read_rollouts
from rlhf_jax.analysis.rollouts import rollouts_table
from rlhf_jax.training.metrics import RolloutLog
from tests.training.rollout_logs import TOKENIZER
from tests.training.rollout_logs import rollouts


def test_single_turn_records_are_the_rows_without_padding(tmp_path):
  log = RolloutLog(str(tmp_path), 5, TOKENIZER)
  log.write(1, rollouts())
  log.write(2, rollouts())
  records = read_rollouts(str(tmp_path / "rollouts.jsonl"))
  assert [r["step"] for r in records] == [1, 1, 2, 2]
  first, second = records[:2]
  assert first["token_ids"] == TOKENIZER.encode("abc|d\nef")
  assert first["loss_mask"] == [0, 0, 1, 1, 1, 1, 1, 1]
  assert first["turns"] == [{"role": "assistant", "text": "c|d\nef",
                             "token_ids": TOKENIZER.encode("c|d\nef")}]
  assert (first["reward"], second["reward"]) == (0.5, -1.0)
  assert second["token_ids"] == TOKENIZER.encode("abc|de")
  table = rollouts_table(records[:2])
  # Newlines shown as ⏎, a pipe escaped so the Markdown row keeps its columns.
  assert "| 1 | 0.5 | 6 / 8 | ▶ c\\|d⏎ef |" in table
  log.truncate_after(1)
  assert [r["step"] for r in read_rollouts(str(tmp_path / "rollouts.jsonl"))] == [1, 1]


def test_count_zero_writes_nothing_and_count_one_writes_one(tmp_path):
  RolloutLog(str(tmp_path), 0, TOKENIZER).write(1, rollouts())
  assert not (tmp_path / "rollouts.jsonl").exists()
  RolloutLog(str(tmp_path), 1, TOKENIZER).write(1, rollouts())
  lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
  assert len(lines) == 1 and json.loads(lines[0])["reward"] == 0.5


def test_each_record_says_why_its_reward_failed(tmp_path):
  from rlhf_jax.rollout import Group
  from rlhf_jax.rollout.generation import pack_groups
  from rlhf_jax.data import Example
  reason = "reward.function f: raised ZeroDivisionError: division by zero"
  group = Group(Example("q", "1", "t"), TOKENIZER.encode("ab"),
                [TOKENIZER.encode("c"), TOKENIZER.encode("de")], [[0.0], [0.0, 0.0]],
                [1.0, -1.0], [True, False], [False, False], ["", reason])
  packed = pack_groups([group], prompt_length=4, response_length=4, pad_id=TOKENIZER.pad_id)
  assert packed.failures == [reason]
  RolloutLog(str(tmp_path), 2, TOKENIZER).write(1, packed)
  records = read_rollouts(str(tmp_path / "rollouts.jsonl"))
  assert [r["failure"] for r in records] == ["", reason]


def test_rollout_metrics_split_lengths_by_verdict_over_finished_rows():
  from rlhf_jax.rollout.generation import Rollouts
  from rlhf_jax.training.metrics import rollout_metrics
  # Rows of 2, 3, 1 and 4 tokens; the third is a T-PPO row still in flight (no verdict).
  batch = batch_lib.build_rollout_batch(
      [[5]] * 4, [[9, 10], [11, 12, 13], [14], [1, 2, 3, 4]], [[0.0] * 2, [0.0] * 3, [0.0],
                                                               [0.0] * 4],
      [1.0, -1.0, 0.0, 1.0], [False] * 4, [0, 0, 1, 1], prompt_length=2, response_length=4,
      pad_id=0, finished=[True, True, False, True])
  out = rollout_metrics(Rollouts(batch, correct=[True, False, True], failures=[], metrics={}),
                        {"scores": np.asarray([1.0, -1.0, 0.0, 1.0])})
  assert out["response_length_correct_mean"] == (2 + 4) / 2
  assert out["response_length_wrong_mean"] == 3
  assert out["response_length_mean"] == (2 + 3 + 4) / 3 and out["accuracy"] == 2 / 3
  everything_right = rollout_metrics(
      Rollouts(batch, correct=[True] * 3, failures=[], metrics={}),
      {"scores": np.asarray([1.0, 1.0, 0.0, 1.0])})
  assert "response_length_wrong_mean" not in everything_right
