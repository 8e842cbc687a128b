"""Prompt sources: JSONL/Parquet round trips, column mappings, errors naming file/row/field."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_jax.data import Example
from rlhf_jax.data import read_examples
from rlhf_jax.data import read_tfds
from rlhf_jax.data import write_examples

EXAMPLES = [Example("1+1?", "2", "arith", {"level": 1}),
            Example("Half of 1?", "\\frac{1}{2}", "math", {},
                    [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Half of 1?"}])]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path, suffix):
  path = str(tmp_path / f"data{suffix}")
  assert write_examples(path, EXAMPLES) == 2
  assert read_examples(path) == EXAMPLES


def test_verl_parquet_layout_through_a_column_mapping(tmp_path):
  table = pa.Table.from_pylist([
      {"data_source": "math", "prompt": [{"role": "user", "content": "What is 2+3?"}],
       "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": 7}},
      {"data_source": "gsm8k", "prompt": [{"role": "system", "content": "Think."},
                                          {"role": "user", "content": "6*7?"}],
       "reward_model": {"style": "rule", "ground_truth": "42"}, "extra_info": {"index": 8}},
  ])
  path = str(tmp_path / "verl.parquet")
  pq.write_table(table, path)
  examples = read_examples(path, columns={"answer": "reward_model.ground_truth",
                                          "task": "data_source"})
  first, second = examples
  assert (first.prompt, first.answer, first.task) == ("What is 2+3?", "5", "math")
  assert first.messages == [{"role": "user", "content": "What is 2+3?"}]
  assert first.metadata == {"extra_info": {"index": 7}}
  assert (second.prompt, second.answer, second.task) == ("6*7?", "42", "gsm8k")
  assert len(second.messages) == 2


def test_errors_name_file_row_and_field(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({"prompt": "a", "answer": "b", "task": "t"}) + "\n"
                  + json.dumps({"prompt": "a", "answer": ["b"], "task": "t"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'answer' must be a string"):
    read_examples(str(path))
  path.write_text("{not json\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: not JSON"):
    read_examples(str(path))
  path.write_text("\n")
  with pytest.raises(ValueError, match=r"bad.jsonl: no examples"):
    read_examples(str(path))
  with pytest.raises(FileNotFoundError, match="missing.parquet: no such file"):
    read_examples(str(tmp_path / "missing.parquet"))
  with pytest.raises(ValueError, match="unknown format '.csv'"):
    (tmp_path / "x.csv").write_text("a")
    read_examples(str(tmp_path / "x.csv"))
  parquet = str(tmp_path / "bad.parquet")
  pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "1", "task": "t"}] * 2
                                      + [{"question": "q", "answer": None, "task": "t"}]),
                 parquet)
  with pytest.raises(ValueError, match=r"bad.parquet: row 0: field 'prompt': no column "
                     r"'prompt'"):
    read_examples(parquet)
  with pytest.raises(ValueError, match=r"bad.parquet: row 2: field 'answer' must be a string"):
    read_examples(parquet, columns={"prompt": "question"})
  with pytest.raises(ValueError, match=r"row 0: field 'answer': no column 'reward_model'"):
    read_examples(parquet, columns={"prompt": "question", "answer": "reward_model.truth"})
  with pytest.raises(ValueError, match="unknown fields \\['question'\\]"):
    read_examples(parquet, columns={"question": "prompt"})


def test_default_task_fills_a_missing_task_column(tmp_path):
  path = tmp_path / "gsm.jsonl"
  path.write_text(json.dumps({"question": "1+2?", "answer": 3}) + "\n")
  (example,) = read_examples(str(path), columns={"prompt": "question"}, default_task="math")
  assert (example.prompt, example.answer, example.task) == ("1+2?", "3", "math")


def test_tfds_without_the_package_says_which_extra(monkeypatch):
  import builtins
  real_import = builtins.__import__

  def no_tfds(name, *args, **kwargs):
    if name == "tensorflow_datasets":
      raise ImportError("not installed")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_tfds)
  with pytest.raises(ImportError, match=r"pip install 'rlhf-jax\[tfds\]'"):
    read_tfds("gsm8k", split="test")


def test_numbers_as_answers_become_strings(tmp_path):
  path = str(tmp_path / "numbers.parquet")
  pq.write_table(pa.Table.from_pylist([{"prompt": "q", "answer": 42, "task": "arith"},
                                       {"prompt": "q", "answer": 7, "task": "arith"}]), path)
  assert [e.answer for e in read_examples(path)] == ["42", "7"]
