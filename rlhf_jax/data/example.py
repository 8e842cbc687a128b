"""One prompt record (`Example`) and the rule that turns a file's record into one.

Schema: `prompt` (str, or a chat list), `answer` (str; numbers are turned into strings),
`task` (str), optional `metadata` (object) and `messages` (a chat list of {"role",
"content"}). A column mapping (our field → a dotted path in the record) reads other
layouts; a chat-list `prompt` becomes `messages`, and `prompt` its last user turn. The
record's other columns (the mapped ones included) stay in `metadata` under their own
names, where a reward function finds them (rewards/functions.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

FIELDS = ("prompt", "answer", "task", "metadata", "messages")
# `data.answer_format`: how the reference is read from the answer column.
ANSWER_FORMATS = ("as_is", "gsm8k", "boxed")


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt with its reference answer.

  Attributes:
    prompt: the text given to the model.
    answer: the reference the task's verifier compares against.
    task: which verifier scores it (e.g. "arith", "math").
    metadata: anything else (difficulty, source, a worked solution for SFT).
    messages: the chat form of the prompt (a tuple of {"role", "content"} dicts; any
      sequence given is stored as one) when the data has one; `prompt` is then its last
      user turn.
  """
  prompt: str
  answer: str
  task: str
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  messages: tuple[dict[str, str], ...] | None = None

  def __post_init__(self):
    if self.messages is not None:
      object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))


def is_chat(value: Any) -> bool:
  """Whether `value` is a list of {"role": str, "content": str} messages."""
  return isinstance(value, (list, tuple)) and all(
      isinstance(m, Mapping) and isinstance(m.get("role"), str)
      and isinstance(m.get("content"), str) for m in value)


def _chat(value: Any) -> tuple[dict[str, Any], ...]:
  """A chat list as plain dicts, without the None keys a Parquet struct adds."""
  return tuple({k: v for k, v in m.items() if v is not None} for m in value)


def _lookup(record: Mapping, path: str, where: str) -> Any:
  """`record` at the dotted `path`; a missing part names the path so far."""
  value: Any = record
  parts = path.split(".")
  for i, part in enumerate(parts):
    if not isinstance(value, Mapping) or part not in value:
      have = sorted(value) if isinstance(value, Mapping) else type(value).__name__
      raise ValueError(f"{where}: no column {'.'.join(parts[:i + 1])!r} (path {path!r}); "
                       f"there: {have}.")
    value = value[part]
  return value


def _json_value(value: Any) -> tuple[bool, Any]:
  """(True, a JSON copy of `value`) or (False, None) when it has no JSON form."""
  try:
    return True, json.loads(json.dumps(value, allow_nan=False))
  except (TypeError, ValueError):
    return False, None


def _boxed(text: str) -> str | None:
  """The content of the last \\boxed{...} of `text` (braces balanced), or None."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth, begin = 0, start + len("\\boxed{")
  for i in range(begin, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth < 0:
      return text[begin:i].strip()
  return None


def reference_of(answer: str, answer_format: str, where: str) -> str:
  """The reference in an answer column: as it is, GSM8K's number after the last "####"
  (commas dropped), or MATH's last \\boxed{} of a worked solution; an answer without
  the marker is an error naming `where`."""
  if answer_format == "as_is":
    return answer
  if answer_format == "gsm8k":
    if "####" not in answer:
      raise ValueError(f"{where}: field 'answer' has no '#### N' line (data.answer_format="
                       f"'gsm8k'): {answer[-60:]!r}.")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")
  if answer_format == "boxed":
    boxed = _boxed(answer)
    if boxed is None:
      raise ValueError(f"{where}: field 'answer' has no \\boxed{{...}} (data.answer_format="
                       f"'boxed'): {answer[-60:]!r}.")
    return boxed
  raise ValueError(f"answer_format {answer_format!r}; allowed: {', '.join(ANSWER_FORMATS)}.")


def _metadata(record: Mapping, paths: Mapping[str, str], where: str) -> dict[str, Any]:
  """The record's metadata column (an object, or JSON text as Parquet keeps it) with the
  record's other JSON-able columns under their own names (which: the comment inside)."""
  metadata = record.get(paths["metadata"])
  if metadata is None:
    metadata = {}
  if isinstance(metadata, str):  # write_examples keeps it as JSON text in Parquet
    try:
      metadata = json.loads(metadata)
    except (ValueError, RecursionError):
      raise ValueError(f"{where}: field 'metadata' is text but not JSON (or nested too "
                       "deeply to read).") from None
  if not isinstance(metadata, Mapping):
    raise ValueError(f"{where}: field 'metadata' must be an object; got "
                     f"{type(metadata).__name__}.")
  metadata = dict(metadata)
  # The record's columns stay under their own names, a flat answer column and the task's
  # source too (a reward function written for another library reads them, e.g. TRL's
  # `solution`, verl's `data_source`); not the prompt's, nor a nested answer's source
  # (verl's `reward_model`, which can be large, reaches a function as `answer`).
  used = {field for field, path in paths.items() if path == field}
  used.update(paths[f].split(".")[0] for f in ("prompt", "messages", "metadata"))
  if "." in paths["answer"]:
    used.add(paths["answer"].split(".")[0])
  for key, value in record.items():  # the rest of the record, where it is JSON
    ok, value = _json_value(value)
    if key not in used and ok:
      metadata.setdefault(key, value)
  return metadata


def record_to_example(record: Any, where: str, columns: Mapping[str, str] | None = None,
                      default_task: str | None = None, *, strict: bool = False,
                      numbers: bool = True, answer_format: str = "as_is",
                      task_aliases: Mapping[str, str] | None = None) -> Example:
  """One record → Example; every error names `where` (file and row) and the field.

  Args:
    record: the file's record (a dict).
    where: "file:line" or "file: row N", the start of every error.
    columns: our field → dotted path in the record (unmapped fields: their own name;
      "answer" mapped to "" means no reference column: the answer is "").
    default_task: the task of a record without the task column.
    strict: fields other than ours are an error (else they go to `metadata`, where JSON).
    numbers: a number as `answer` becomes a string (else it is a type error).
    answer_format: how the reference is read from the answer (`reference_of`).
    task_aliases: task values read as another task (verl's `data_source` names).
  """
  if not isinstance(record, Mapping):
    raise ValueError(f"{where}: expected an object, got {type(record).__name__}.")
  unknown = set(columns or {}) - set(FIELDS)
  if unknown:
    raise ValueError(f"column mapping names unknown fields {sorted(unknown)}; ours: "
                     f"{', '.join(FIELDS)}.")
  paths = {field: (columns or {}).get(field, field) for field in FIELDS}
  if strict:
    extra = set(record) - set(FIELDS)
    if extra:
      raise ValueError(f"{where}: unknown fields {sorted(extra)}; allowed: "
                       f"{', '.join(FIELDS)} (or give a column mapping).")
  values: dict[str, Any] = {}
  for field in ("prompt", "answer", "task"):
    if field == "task" and default_task is not None and paths["task"] not in record:
      values["task"] = default_task
      continue
    if field == "answer" and not paths["answer"]:
      values["answer"] = ""
      continue
    if field == "answer" and "." not in paths["answer"] and paths["answer"] not in record:
      raise ValueError(f"{where}: field 'answer': no column {paths['answer']!r}; there: "
                       f"{sorted(record)}; name the reference column with data.columns="
                       "'answer=<column>' (or 'answer=' for rows without one).")
    if field == "task" and "." not in paths["task"] and paths["task"] not in record:
      raise ValueError(f"{where}: field 'task': no column {paths['task']!r}; give the rows "
                       "one task with data.default_task (or data.columns='task=<column>').")
    value = _lookup(record, paths[field], f"{where}: field {field!r}")
    if field == "answer" and isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f"{where}: field 'answer' is {value!r}; a reference answer must be "
                       "a finite number or a string.")
    if (field == "answer" and numbers and isinstance(value, (int, float))
        and not isinstance(value, bool)):
      value = str(value)
    if field == "prompt" and is_chat(value):
      values["messages"] = _chat(value)
      users = [m["content"] for m in value if m["role"] == "user"]
      if not users:
        raise ValueError(f"{where}: field 'prompt' is a chat list without a user turn.")
      value = users[-1]
    if not isinstance(value, str):
      raise ValueError(f"{where}: field {field!r} must be a string; got {value!r}"[:300] + ".")
    values[field] = value
  values["answer"] = reference_of(values["answer"], answer_format, where)
  values["task"] = (task_aliases or {}).get(values["task"], values["task"])
  metadata = _metadata(record, paths, where)
  messages = record.get(paths["messages"])
  if "messages" not in values and messages is not None:
    if not is_chat(messages):
      raise ValueError(f"{where}: field 'messages' must be a list of "
                       "{'role': str, 'content': str} objects.")
    values["messages"] = _chat(messages)
  return Example(values["prompt"], values["answer"], values["task"], metadata,
                 values.get("messages"))


def to_record(example: Example) -> dict[str, Any]:
  """An Example as a JSON-able dict (without `messages` when it has none)."""
  record = {"prompt": example.prompt, "answer": example.answer, "task": example.task,
            "metadata": example.metadata}
  if example.messages is not None:
    record["messages"] = [dict(m) for m in example.messages]
  return record

