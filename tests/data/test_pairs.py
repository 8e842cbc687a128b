"""Preference pairs (data/pairs.py): JSONL and Parquet round trips, and a bad pair named by its
line and field."""

from __future__ import annotations

import pytest

from rlhf_jax.data import PreferencePair
from rlhf_jax.data import read_pairs
from rlhf_jax.data import write_pairs


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_preference_pairs_round_trip(tmp_path, suffix):
  pairs = [PreferencePair("p", "good", "bad", {"level": 2}), PreferencePair("q", "a", "b")]
  path = str(tmp_path / f"pairs{suffix}")
  assert write_pairs(path, pairs) == 2
  assert read_pairs(path) == pairs


def test_a_bad_pair_names_the_line_and_field(tmp_path):
  path = tmp_path / "pairs.jsonl"
  path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n'
                  '{"prompt": "p", "chosen": 3, "rejected": "b"}\n')
  with pytest.raises(ValueError, match=r"pairs.jsonl:2: field 'chosen'"):
    read_pairs(str(path))
