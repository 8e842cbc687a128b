"""Prompt data as JSONL (data/jsonl.py): a round trip of arith problems, errors naming the line
and field, and the prompt stream's epochs, exact resume and file order."""

import json

import pytest

from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.data import read_jsonl
from rlhf_jax.data import write_jsonl
from rlhf_jax.tasks import arith



def test_jsonl_round_trip_and_errors_name_line_and_field(tmp_path):
  path = tmp_path / "data.jsonl"
  problems = list(arith.generate(0, 5))
  assert write_jsonl(str(path), [p.to_json() for p in problems]) == 5
  examples = read_jsonl(str(path))
  assert [e.answer for e in examples] == [str(p.answer) for p in problems]
  assert examples[0].task == "arith" and "solution" in examples[0].metadata
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"prompt": "q", "answer": 3, "task": "arith"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'answer'"):
    read_jsonl(str(bad))
  bad.write_text('{"prompt": "q", "answer": "3", "task": "arith", "extra": 1}\n')
  with pytest.raises(ValueError, match="unknown fields"):
    read_jsonl(str(bad))
  bad.write_text('{"prompt": "q",\n')
  with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
    read_jsonl(str(bad))


def test_prompt_stream_covers_each_epoch_and_resumes_exactly():
  examples = [Example(str(i), str(i), "arith") for i in range(7)]
  stream = PromptStream(examples, seed=1)
  first_epoch = stream.take(7)
  assert sorted(e.prompt for e in first_epoch) == [str(i) for i in range(7)]
  stream.take(3)
  saved = stream.state()
  expected = [e.prompt for e in stream.take(9)]
  resumed = PromptStream(examples, seed=1)
  resumed.restore(saved)
  assert [e.prompt for e in resumed.take(9)] == expected


def test_prompt_stream_without_shuffle_keeps_file_order():
  examples = [Example(str(i), str(i), "arith") for i in range(5)]
  stream = PromptStream(examples, shuffle=False)
  assert [e.prompt for e in stream.take(7)] == ["0", "1", "2", "3", "4", "0", "1"]
