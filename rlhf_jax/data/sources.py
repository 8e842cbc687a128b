"""Prompt sources: JSONL and Parquet files, other schemas by a column mapping, and TFDS.

Our schema is one record per prompt: `prompt` (str), `answer` (str; numbers are turned
into strings), `task` (str), optional `metadata` (object) and `messages` (a chat list of
{"role", "content"}). A column mapping reads other layouts: our field → a dotted path in
the record, e.g. verl's Parquet files

    columns = {"prompt": "prompt", "answer": "reward_model.ground_truth", "task": "data_source"}

where verl's `prompt` is a chat list: a list-valued prompt becomes `messages`, and
`prompt` its last user turn. verl's `data_source` values map to our tasks through one table
(`VERL_DATA_SOURCES`: GSM8K and the MATH family → 'math', the code-contest sets → 'code').
Every record keeps its other columns in `metadata` (the JSON-able ones, the mapped answer
and task columns included), where reward functions read them. Every error names the file, the row (1-based line of a
JSONL file, 0-based row of a Parquet file) and the field.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import numpy as np

from rlhf_jax.config_errors import invalid
from rlhf_jax.data.example import FIELDS
from rlhf_jax.data.example import Example
from rlhf_jax.data.example import record_to_example
from rlhf_jax.data.example import to_record
from rlhf_jax.data.jsonl import json_lines
from rlhf_jax.data.jsonl import write_jsonl

__all__ = ["FIELDS", "VERL_DATA_SOURCES", "located_examples", "read_examples", "read_tfds",
           "record_to_example", "write_examples"]

SUFFIXES = (".jsonl", ".json", ".parquet")


# verl's `data_source` values (its reward dispatch, `default_compute_score`) → our task:
# a verl Parquet file read with `task=data_source` is scored by the matching verifier.
VERL_DATA_SOURCES = {
    **dict.fromkeys(("openai/gsm8k", "gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-"
                     "lighteval", "HuggingFaceH4/MATH-500", "math_dapo", "math",
                     "math_dapo_reasoning", "numina_aops_forum", "numina_synthetic_math",
                     "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
                     "numina_olympiads", "aime2024", "aime2025", "aime24", "aime25",
                     "amc23"), "math"),
    # stdin/stdout cases as JSON {"inputs", "outputs"}: CodeScorer runs them (run_io)
    **dict.fromkeys(("codecontests", "apps", "taco", "codeforces", "primeintellect",
                     "livecodebench"), "code"),
}


def parse_columns(text: str) -> dict[str, str]:
  """`data.columns` ("answer=reward_model.ground_truth,task=data_source") as a mapping;
  "answer=" (nothing after it) reads rows without a reference (the answer is "")."""
  mapping = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    field, equals, path = (p.strip() for p in item.partition("="))
    if field not in FIELDS or not equals or (not path and field != "answer"):
      invalid("data.columns", text, f"{item!r} must be field=column with field one of "
              f"{', '.join(FIELDS)} ('answer=' alone: no reference column)")
    mapping[field] = path
  return mapping


def _pyarrow():
  """pyarrow with its Parquet module, or an ImportError naming the extra."""
  try:
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ImportError("Parquet files need pyarrow: pip install 'rlhf-jax[parquet]'") from None
  return pyarrow


def _suffix(path: str) -> str:
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in SUFFIXES:
    raise ValueError(f"{path}: unknown format {suffix!r}; use one of {', '.join(SUFFIXES)}.")
  return suffix


def read_examples(path: str, *, columns: Mapping[str, str] | None = None,
                  default_task: str | None = None, answer_format: str = "as_is",
                  task_aliases: Mapping[str, str] | None = None) -> list[Example]:
  """Examples of a .jsonl/.json (one object per line) or .parquet file (module docstring).

  Args:
    path: the file.
    columns: our field → dotted path in the record (e.g. "reward_model.ground_truth").
    default_task: the task of records without a task column.
    answer_format: 'as_is', 'gsm8k' (the number after "####") or 'boxed' (the last
      \\boxed{} of a worked solution): `data.answer_format`.
    task_aliases: task values read as another task (default: `VERL_DATA_SOURCES`).

  Returns:
    The examples in file order.
  """
  return [example for _, example in located_examples(
      path, columns=columns, default_task=default_task, answer_format=answer_format,
      task_aliases=task_aliases)]


def located_examples(path: str, *, columns: Mapping[str, str] | None = None,
                     default_task: str | None = None, answer_format: str = "as_is",
                     task_aliases: Mapping[str, str] | None = None
                     ) -> list[tuple[str, Example]]:
  """`read_examples`, each example with where it is ("f.jsonl:3", "f.parquet: row 2"),
  for checks that name the row."""
  aliases = VERL_DATA_SOURCES if task_aliases is None else task_aliases
  examples = [(where, record_to_example(record, where, columns, default_task,
                                        answer_format=answer_format, task_aliases=aliases))
              for where, record in read_records(path)]
  if not examples:
    raise ValueError(f"{path}: no examples (empty file).")
  return examples


def write_examples(path: str, examples: Iterable[Example]) -> int:
  """Writes examples as JSONL or Parquet by extension (Parquet keeps `metadata` as a JSON
  string column, which `read_examples` turns back into an object); returns the count."""
  examples = list(examples)
  if _suffix(path) != ".parquet":
    return write_jsonl(path, examples)
  pa = _pyarrow()
  rows = []
  for example in examples:
    record = to_record(example)
    record["metadata"] = json.dumps(record["metadata"])
    record.setdefault("messages", None)
    rows.append(record)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  pa.parquet.write_table(pa.Table.from_pylist(rows), path)
  return len(rows)


def _plain(value: Any) -> Any:
  """A TFDS feature value as plain Python (bytes → str, NumPy → lists and scalars)."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    return _plain(value.tolist())
  if isinstance(value, np.generic):
    return _plain(value.item())
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def read_tfds(name: str, *, split: str, data_dir: str | None = None,
              columns: Mapping[str, str] | None = None,
              default_task: str | None = None) -> list[Example]:
  """Examples of a prepared TFDS dataset through `tfds.data_source` (ArrayRecord files,
  random access, no TensorFlow); `columns` maps our fields to its feature names.

  Args:
    name: the dataset ("gsm8k", "my_dataset:1.0.0").
    split: e.g. "train" or "test[:10%]".
    data_dir: where it was prepared (None: TFDS's default).
    columns: as `read_examples`'.
    default_task: as `read_examples`'.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError("TFDS datasets need tensorflow-datasets (and array_record): "
                      "pip install 'rlhf-jax[tfds]'") from None
  source = tfds.data_source(name, split=split, data_dir=data_dir)
  examples = [record_to_example(_plain(dict(source[row])), f"tfds:{name}[{split}]: row {row}",
                                columns, default_task) for row in range(len(source))]
  if not examples:
    raise ValueError(f"tfds:{name}[{split}]: no examples.")
  return examples


def read_records(path: str) -> list[tuple[str, Any]]:
  """(where, record) of every record of a .jsonl/.json or .parquet file, `where` naming
  the file and line ("f.jsonl:3") or row ("f.parquet: row 2") for error messages."""
  suffix = _suffix(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file.")
  if suffix == ".parquet":
    pa = _pyarrow()
    try:
      records = pa.parquet.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:  # a corrupt or non-Parquet file
      raise ValueError(f"{path}: not a readable Parquet file ({error}).") from None
    return [(f"{path}: row {i}", r) for i, r in enumerate(records)]
  return [(f"{path}:{n}", r) for n, r in json_lines(path)]


def write_records(path: str, records: list[dict[str, Any]]) -> int:
  """Writes dict records as JSONL or Parquet by extension (Parquet keeps `metadata` as a
  JSON string column); returns the count."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if _suffix(path) == ".parquet":
    pa = _pyarrow()
    rows = [dict(r, metadata=json.dumps(r.get("metadata") or {})) for r in records]
    pa.parquet.write_table(pa.Table.from_pylist(rows), path)
  else:
    with open(path, "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")
  return len(records)
