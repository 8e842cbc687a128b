"""Prompt sources: JSONL/Parquet round trips, column mappings, errors naming file/row/field."""

import builtins
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_jax.data import Example
from rlhf_jax.data import read_examples
from rlhf_jax.data import read_tfds
from rlhf_jax.data import write_examples

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Half of 1?"}]
EXAMPLES = [Example("1+1?", "2", "arith", {"level": 1, "tags": ["a"]}),
            Example("Half of 1?", "\\frac{1}{2}", "math", {}, CHAT)]


def write_lines(path, *records):
  path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
  return str(path)


def test_messages_are_stored_as_a_tuple():
  assert EXAMPLES[1].messages == tuple(CHAT)
  assert EXAMPLES[1] == Example("Half of 1?", "\\frac{1}{2}", "math", {}, tuple(CHAT))


@pytest.mark.parametrize("first,second", [(".jsonl", ".parquet"), (".parquet", ".jsonl"),
                                          (".json", ".parquet")])
def test_round_trips_between_formats(tmp_path, first, second):
  a, b = str(tmp_path / f"a{first}"), str(tmp_path / f"b{second}")
  assert write_examples(a, EXAMPLES) == 2
  assert read_examples(a) == EXAMPLES
  assert write_examples(b, read_examples(a)) == 2
  assert read_examples(b) == EXAMPLES


def test_parquet_keeps_metadata_as_a_json_column(tmp_path):
  path = str(tmp_path / "data.parquet")
  write_examples(path, EXAMPLES)
  table = pq.read_table(path)
  assert table.schema.field("metadata").type == pa.string()
  assert json.loads(table.column("metadata")[0].as_py()) == {"level": 1, "tags": ["a"]}


def test_verl_parquet_layout_through_a_column_mapping(tmp_path):
  table = pa.Table.from_pylist([
      {"data_source": "math", "prompt": [{"role": "user", "content": "What is 2+3?"}],
       "ability": "math", "reward_model": {"style": "rule", "ground_truth": "5"},
       "extra_info": {"index": 7}, "blob": b"\x00"},
      {"data_source": "gsm8k", "prompt": [{"role": "system", "content": "Think."},
                                          {"role": "user", "content": "6*7?"}],
       "ability": "math", "reward_model": {"style": "rule", "ground_truth": "42"},
       "extra_info": {"index": 8}, "blob": b"\x01"},
  ])
  path = str(tmp_path / "verl.parquet")
  pq.write_table(table, path)
  first, second = read_examples(path, columns={
      "prompt": "prompt", "answer": "reward_model.ground_truth", "task": "data_source"})
  assert (first.prompt, first.answer, first.task) == ("What is 2+3?", "5", "math")
  assert first.messages == ({"role": "user", "content": "What is 2+3?"},)
  # The file's JSON-able columns stay in metadata under their own names (reward functions
  # read them), the task's source too; bytes (not JSON), the prompt and a nested answer's
  # source (it reaches a function as the answer) do not.
  assert first.metadata == {"ability": "math", "extra_info": {"index": 7},
                            "data_source": "math"}
  # verl's data_source names map to our tasks through one table.
  assert (second.prompt, second.answer, second.task) == ("6*7?", "42", "math")
  assert second.metadata["data_source"] == "gsm8k"
  assert second.messages == ({"role": "system", "content": "Think."},
                             {"role": "user", "content": "6*7?"})


def test_chat_list_prompt_in_jsonl_becomes_messages(tmp_path):
  path = write_lines(tmp_path / "chat.jsonl",
                     {"q": CHAT, "a": 0.5, "source": "math", "split": "train"})
  (example,) = read_examples(path, columns={"prompt": "q", "answer": "a", "task": "source"})
  assert example == Example("Half of 1?", "0.5", "math",
                           {"split": "train", "a": 0.5, "source": "math"}, CHAT)


def test_numbers_as_answers_become_strings(tmp_path):
  parquet = str(tmp_path / "numbers.parquet")
  pq.write_table(pa.Table.from_pylist([{"prompt": "q", "answer": 42, "task": "arith"},
                                       {"prompt": "q", "answer": -7, "task": "arith"}]), parquet)
  assert [e.answer for e in read_examples(parquet)] == ["42", "-7"]
  jsonl = write_lines(tmp_path / "numbers.jsonl", {"prompt": "q", "answer": 3, "task": "t"},
                      {"prompt": "q", "answer": 2.5, "task": "t"})
  assert [e.answer for e in read_examples(jsonl)] == ["3", "2.5"]


def test_default_task_fills_a_missing_task_column(tmp_path):
  path = write_lines(tmp_path / "gsm.jsonl", {"question": "1+2?", "answer": 3})
  (example,) = read_examples(path, columns={"prompt": "question"}, default_task="math")
  assert (example.prompt, example.answer, example.task) == ("1+2?", "3", "math")


def test_jsonl_errors_name_file_line_and_field(tmp_path):
  path = tmp_path / "bad.jsonl"
  good = {"prompt": "a", "answer": "b", "task": "t"}
  cases = [
      ((good, {**good, "answer": ["b"]}), r"bad.jsonl:2: field 'answer' must be a string"),
      ((good, "\n", {"prompt": "a", "answer": "b"}),
       r"bad.jsonl:3: field 'task': no column 'task'"),
      (({**good, "metadata": [1]},), r"bad.jsonl:1: field 'metadata' must be an object"),
      (({**good, "messages": [{"role": "user"}]},), r"bad.jsonl:1: field 'messages' must be"),
      (("{not json\n",), r"bad.jsonl:1: not JSON"),
      (("[1, 2]\n",), r"bad.jsonl:1: expected an object, got list"),
      (("\n\n",), r"bad.jsonl: no examples \(empty file\)"),
  ]
  for records, message in cases:
    with pytest.raises(ValueError, match=message):
      read_examples(write_lines(path, *records))
  write_lines(path, {"q": [{"role": "system", "content": "x"}], "answer": "1", "task": "t"})
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'prompt' is a chat list without"):
    read_examples(str(path), columns={"prompt": "q"})
  with pytest.raises(FileNotFoundError, match=r"missing.jsonl: no such file"):
    read_examples(str(tmp_path / "missing.jsonl"))
  with pytest.raises(ValueError, match=r"x.csv: unknown format '.csv'"):
    read_examples(str(tmp_path / "x.csv"))


def test_parquet_errors_name_file_row_and_field(tmp_path):
  path = str(tmp_path / "bad.parquet")
  pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "1", "task": "t"}] * 2
                                      + [{"question": "q", "answer": None, "task": "t"}]), path)
  cases = [
      ({}, r"bad.parquet: row 0: field 'prompt': no column 'prompt'"),
      ({"prompt": "question"}, r"bad.parquet: row 2: field 'answer' must be a string; got None"),
      ({"prompt": "question", "answer": "reward_model.truth"},
       r"bad.parquet: row 0: field 'answer': no column 'reward_model' \(path "
       r"'reward_model.truth'\)"),
      ({"prompt": "question", "answer": "answer.truth"},
       r"row 0: field 'answer': no column 'answer.truth'"),
      ({"question": "prompt"}, r"unknown fields \['question'\]"),
  ]
  for columns, message in cases:
    with pytest.raises(ValueError, match=message):
      read_examples(path, columns=columns)
  pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
  with pytest.raises(ValueError, match=r"bad.parquet: no examples"):
    read_examples(path)
  (tmp_path / "bad.parquet").write_text("not parquet")
  with pytest.raises(ValueError, match=r"bad.parquet: not a readable Parquet file"):
    read_examples(path)
  with pytest.raises(FileNotFoundError, match=r"missing.parquet: no such file"):
    read_examples(str(tmp_path / "missing.parquet"))


def hide_module(monkeypatch, module):
  """Makes `import module` (and its submodules) fail as if it were not installed."""
  real_import = builtins.__import__

  def fake_import(name, *args, **kwargs):
    if name == module or name.startswith(module + "."):
      raise ImportError(f"No module named {name!r}")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", fake_import)


def test_tfds_without_the_package_says_which_extra(monkeypatch):
  hide_module(monkeypatch, "tensorflow_datasets")
  with pytest.raises(ImportError, match=r"pip install 'rlhf-jax\[tfds\]'"):
    read_tfds("gsm8k", split="test", data_dir=None, columns={"prompt": "question"})


def test_parquet_without_pyarrow_says_which_extra(tmp_path, monkeypatch):
  path = str(tmp_path / "data.parquet")
  write_examples(path, EXAMPLES)
  hide_module(monkeypatch, "pyarrow")
  with pytest.raises(ImportError, match=r"pip install 'rlhf-jax\[parquet\]'"):
    read_examples(path)
  with pytest.raises(ImportError, match=r"pip install 'rlhf-jax\[parquet\]'"):
    write_examples(path, EXAMPLES)
