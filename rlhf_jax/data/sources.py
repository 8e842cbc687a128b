"""Prompt sources: JSONL and Parquet files, other schemas by a column mapping, and TFDS.

Our schema is one record per prompt: `prompt` (str), `answer` (str; numbers are turned
into strings), `task` (str), optional `metadata` (object) and `messages` (a chat list of
{"role", "content"}). A column mapping reads other layouts: our field → a dotted path in
the record, e.g. verl's Parquet files

    columns = {"prompt": "prompt", "answer": "reward_model.ground_truth", "task": "data_source"}

where verl's `prompt` is a chat list: a list-valued prompt becomes `messages`, and
`prompt` its last user turn. With a mapping (and for Parquet) the record's other columns go
to `metadata`; a plain JSONL file without one is read strictly (data/jsonl.py). Every error
names the file, the row (1-based line of a JSONL file, 0-based row of a Parquet file) and
the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Mapping

from rlhf_jax.data.jsonl import Example
from rlhf_jax.data.jsonl import _is_chat
from rlhf_jax.data.jsonl import read_jsonl
from rlhf_jax.data.jsonl import write_jsonl

FIELDS = ("prompt", "answer", "task", "metadata", "messages")
SUFFIXES = (".jsonl", ".json", ".parquet")


def _pyarrow():
  try:
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ImportError("Parquet files need pyarrow: pip install 'rlhf-jax[parquet]'") from None
  return pyarrow


def _lookup(record: Mapping, path: str, where: str) -> Any:
  value: Any = record
  for i, part in enumerate(path.split(".")):
    if not isinstance(value, Mapping) or part not in value:
      raise ValueError(f"{where}: no column {'.'.join(path.split('.')[:i + 1])!r} "
                       f"(wanted {path!r}); columns here: {sorted(value) if isinstance(value, Mapping) else type(value).__name__}.")
    value = value[part]
  return value


def record_to_example(record: Mapping, where: str, columns: Mapping[str, str] | None = None,
                      default_task: str | None = None) -> Example:
  """One record → Example, through `columns` (our field → dotted path); errors name
  `where` (file and row) and the field."""
  if not isinstance(record, Mapping):
    raise ValueError(f"{where}: expected an object, got {type(record).__name__}.")
  columns = dict(columns or {})
  unknown = set(columns) - set(FIELDS)
  if unknown:
    raise ValueError(f"column mapping names unknown fields {sorted(unknown)}; ours: {FIELDS}.")
  paths = {field: columns.get(field, field) for field in FIELDS}
  values: dict[str, Any] = {}
  for field in ("prompt", "answer", "task"):
    if field == "task" and default_task is not None and paths["task"] not in record:
      values["task"] = default_task
      continue
    value = _lookup(record, paths[field], f"{where}: field {field!r}")
    if field == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool):
      value = str(value)
    if field == "prompt" and _is_chat(value):
      values["messages"] = [dict(m) for m in value]
      users = [m["content"] for m in value if m["role"] == "user"]
      if not users:
        raise ValueError(f"{where}: field 'prompt' is a chat without a user turn.")
      value = users[-1]
    if not isinstance(value, str):
      raise ValueError(f"{where}: field {field!r} must be a string; got {value!r}"[:300])
    values[field] = value
  metadata = record.get(paths["metadata"], {}) if paths["metadata"] in record else {}
  if isinstance(metadata, str):  # Parquet written by write_examples keeps it as JSON text
    try:
      metadata = json.loads(metadata)
    except ValueError:
      raise ValueError(f"{where}: field 'metadata' is not a JSON object.") from None
  if not isinstance(metadata, Mapping):
    raise ValueError(f"{where}: field 'metadata' must be an object.")
  metadata = dict(metadata)
  if "messages" not in values and paths["messages"] in record and record[paths["messages"]] is not None:
    if not _is_chat(record[paths["messages"]]):
      raise ValueError(f"{where}: field 'messages' must be a list of "
                       "{'role': str, 'content': str} objects.")
    values["messages"] = [dict(m) for m in record[paths["messages"]]]
  used = {p.split(".")[0] for p in paths.values()}
  for key, value in record.items():  # the rest of the record, where it is JSON
    if key not in used:
      try:
        metadata.setdefault(key, json.loads(json.dumps(value)))
      except (TypeError, ValueError):
        pass
  return Example(values["prompt"], values["answer"], values["task"], metadata,
                 values.get("messages"))


def read_examples(path: str, *, columns: Mapping[str, str] | None = None,
                  default_task: str | None = None) -> list[Example]:
  """Examples of a .jsonl/.json (one object per line) or .parquet file (module docstring)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file.")
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in SUFFIXES:
    raise ValueError(f"{path}: unknown format {suffix!r}; use one of {', '.join(SUFFIXES)}.")
  if suffix != ".parquet":
    if not columns and default_task is None:
      return read_jsonl(path)
    examples = []
    with open(path, encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if line.strip():
          try:
            record = json.loads(line)
          except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg}).") from None
          examples.append(record_to_example(record, f"{path}:{number}", columns, default_task))
  else:
    try:
      table = _pyarrow().parquet.read_table(path)
    except ImportError:
      raise
    except Exception as error:  # pyarrow's own errors for a corrupt file
      raise ValueError(f"{path}: not a readable Parquet file ({error}).") from None
    examples = [record_to_example(record, f"{path}: row {row}", columns, default_task)
                for row, record in enumerate(table.to_pylist())]
  if not examples:
    raise ValueError(f"{path}: no examples.")
  return examples


def write_examples(path: str, examples: Iterable[Example]) -> int:
  """Writes examples as JSONL or Parquet (by extension; Parquet keeps `metadata` as JSON
  text, which `read_examples` reads back); returns the count."""
  examples = list(examples)
  if os.path.splitext(path)[1].lower() != ".parquet":
    return write_jsonl(path, examples)
  pa = _pyarrow()
  rows = []
  for example in examples:
    record = dataclasses.asdict(example)
    record["metadata"] = json.dumps(record["metadata"])
    rows.append(record)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  pa.parquet.write_table(pa.Table.from_pylist(rows), path)
  return len(rows)


def read_tfds(name: str, *, split: str, data_dir: str | None = None,
              columns: Mapping[str, str] | None = None,
              default_task: str | None = None) -> list[Example]:
  """Examples of a prepared TFDS dataset through `tfds.data_source` (ArrayRecord files, no
  TensorFlow at read time); `columns` maps our fields to its feature names."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError("TFDS datasets need tensorflow-datasets: pip install "
                      "'rlhf-jax[tfds]'") from None
  source = tfds.data_source(name, split=split, data_dir=data_dir)

  def text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value

  return [record_to_example({k: text(v) for k, v in dict(record).items()},
                            f"tfds:{name}[{split}]: row {row}", columns, default_task)
          for row, record in enumerate(source)]
