"""Labelled response groups (data/labelled.py): JSONL and Parquet round trips (chat prompts
included), preference pairs read as groups of two, and a bad row named by line and field."""

from __future__ import annotations

import pytest

from rlhf_jax.data import LabelledGroup
from rlhf_jax.data import PreferencePair
from rlhf_jax.data import read_labelled
from rlhf_jax.data import write_labelled
from rlhf_jax.data import write_pairs
from rlhf_jax.data.example import Example


def test_labelled_files_pairs_and_groups_round_trip(tmp_path):
  groups = [LabelledGroup(Example("1+1?\n", "", "arith"), ("2", "3", "4"), (1.0, 0.0, 0.0),
                          (True, False, False))]
  write_labelled(str(tmp_path / "g.jsonl"), groups)
  assert read_labelled(str(tmp_path / "g.jsonl"))[0].responses == ("2", "3", "4")
  # A chat prompt survives the file (parquet too), so the groups encode as they were drawn.
  chat = LabelledGroup(Example("q", "1", "math", {"k": 1}, [{"role": "system", "content": "s"},
                                                           {"role": "user", "content": "q"}]),
                       ("1",), (1.0,), (True,))
  for name in ("c.jsonl", "c.parquet"):
    write_labelled(str(tmp_path / name), [chat])
    assert read_labelled(str(tmp_path / name)) == [chat]
  write_pairs(str(tmp_path / "p.jsonl"), [PreferencePair("q", "good", "bad")])
  pair = read_labelled(str(tmp_path / "p.jsonl"))[0]
  assert pair.responses == ("good", "bad") and pair.scores == (1.0, 0.0)
  (tmp_path / "bad.jsonl").write_text('{"prompt": "q", "responses": ["a"], "scores": [1, 2]}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'scores' must be a list of 1"):
    read_labelled(str(tmp_path / "bad.jsonl"))
