"""Reading rollouts.jsonl (analysis/rollouts.py): records by step, a torn last line left out
and a bad one named by file and line, and the Markdown table a person reads."""

from __future__ import annotations

import json

import pytest

from rlhf_jax.analysis.rollouts import read_rollouts
from rlhf_jax.analysis.rollouts import rollouts_table
from rlhf_jax.config_errors import ConfigError


def record(step: int) -> bytes:
  """One rollouts.jsonl line (no newline) with a non-ASCII note."""
  return json.dumps({"step": step, "note": "caf\u00e9 \u2713"}, ensure_ascii=False).encode()


def test_read_rollouts_names_a_bad_line_and_leaves_out_a_torn_last_one(tmp_path):
  path = tmp_path / "rollouts.jsonl"
  path.write_bytes(record(1) + b"\n" + record(2) + b"\n" + record(3)[:-9])
  assert [r["step"] for r in read_rollouts(str(path))] == [1, 2]
  assert [r["note"] for r in read_rollouts(str(path), step=2)] == ["caf\u00e9 \u2713"]
  path.write_bytes(record(1) + b"\n\xc3\n" + record(2) + b"\n")
  with pytest.raises(ConfigError, match=f"^{path}:2: not a rollout record"):
    read_rollouts(str(path))
  with pytest.raises(ConfigError, match="no such file"):
    read_rollouts(str(tmp_path / "nope.jsonl"))


def test_the_table_has_a_line_per_sample_with_its_turns_marked_and_cut():
  records = [{"step": 3, "reward": 0.12345, "token_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 0],
              "turns": [{"role": "assistant", "text": "call|x\n"},
                        {"role": "environment", "text": "42"}]},
             {"step": 4, "reward": -1.0, "token_ids": [5], "loss_mask": [1],
              "turns": [{"role": "tool", "text": "a" * 30}]}]
  lines = rollouts_table(records, width=14).splitlines()
  assert lines[:2] == ["| step | reward | trained / tokens | turns |", "| --- | --- | --- | --- |"]
  # ▶ the model's turn, ◀ the environment's; newlines as ⏎, pipes escaped, cut to 14 characters with …
  assert lines[2] == "| 3 | 0.123 | 2 / 4 | ▶ call\\|x⏎ ◀ … |"
  assert lines[3] == "| 4 | -1 | 1 / 1 | ? " + "a" * 11 + "… |"
  assert len(lines) == 4
