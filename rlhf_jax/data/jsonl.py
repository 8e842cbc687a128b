"""Prompt data as JSONL, one example per line, and a resumable prompt stream.

Schema (training and evaluation alike):
  {"prompt": str, "answer": str, "task": str, "metadata": {...}, "messages": [...]}
  (metadata and messages optional). Parquet files, other schemas and column mappings:
  data/sources.py.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt with its reference answer.

  Attributes:
    prompt: the text given to the model.
    answer: the reference the task's verifier compares against.
    task: which verifier scores it (e.g. "arith", "math").
    metadata: anything else (difficulty, source, a worked solution for SFT).
    messages: the chat form of the prompt ([{"role", "content"}, ...]) when the data has
      one (for a tokenizer with a chat template); `prompt` is then its last user turn.
  """
  prompt: str
  answer: str
  task: str
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  messages: list[dict[str, str]] | None = None


def read_jsonl(path: str) -> list[Example]:
  """Reads examples; errors name the file, line and field."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such JSONL file.")
  examples = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not JSON ({error.msg}).") from None
      if not isinstance(record, dict):
        raise ValueError(f"{path}:{number}: expected an object, got {type(record).__name__}.")
      for field in ("prompt", "answer", "task"):
        if not isinstance(record.get(field), str):
          raise ValueError(f"{path}:{number}: field {field!r} must be a string; got "
                           f"{record.get(field)!r}.")
      unknown = set(record) - {"prompt", "answer", "task", "metadata", "messages"}
      if unknown:
        raise ValueError(f"{path}:{number}: unknown fields {sorted(unknown)}; allowed: prompt, "
                         "answer, task, metadata, messages.")
      metadata = record.get("metadata", {})
      if not isinstance(metadata, dict):
        raise ValueError(f"{path}:{number}: field 'metadata' must be an object.")
      messages = record.get("messages")
      if messages is not None and not _is_chat(messages):
        raise ValueError(f"{path}:{number}: field 'messages' must be a list of "
                         "{'role': str, 'content': str} objects.")
      examples.append(Example(record["prompt"], record["answer"], record["task"], metadata,
                              messages))
  if not examples:
    raise ValueError(f"{path}: no examples.")
  return examples


def _is_chat(value) -> bool:
  """Whether `value` is a list of {"role": str, "content": str} messages."""
  return isinstance(value, (list, tuple)) and all(
      isinstance(m, dict) and isinstance(m.get("role"), str)
      and isinstance(m.get("content"), str) for m in value)


def write_jsonl(path: str, examples: Iterable[Example | dict]) -> int:
  """Writes examples (Example or dict records); returns the count."""
  count = 0
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for example in examples:
      record = dataclasses.asdict(example) if isinstance(example, Example) else example
      if record.get("messages", 0) is None:
        record = {k: v for k, v in record.items() if k != "messages"}
      f.write(json.dumps(record) + "\n")
      count += 1
  return count


class PromptStream:
  """Examples in a fresh seeded shuffle each epoch, with a position for exact resume.

  Args:
    examples: the dataset.
    seed: shuffle seed.
    shuffle: shuffle each epoch (False: file order).
  """

  def __init__(self, examples: Sequence[Example], *, seed: int = 0, shuffle: bool = True):
    if not examples:
      raise ValueError("PromptStream needs at least one example.")
    self.examples = list(examples)
    self.seed = seed
    self.shuffle = shuffle
    self.epoch = 0
    self.index = 0
    self._mix: collections.Counter = collections.Counter()

  def _order(self, epoch: int) -> np.ndarray:
    if not self.shuffle:
      return np.arange(len(self.examples))
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

  def take(self, count: int) -> list[Example]:
    """The next `count` examples (crossing epoch boundaries)."""
    out = []
    while len(out) < count:
      order = self._order(self.epoch)
      take = min(count - len(out), len(order) - self.index)
      out.extend(self.examples[i] for i in order[self.index:self.index + take])
      self.index += take
      if self.index == len(order):
        self.epoch, self.index = self.epoch + 1, 0
    self._mix.update(e.task for e in out)
    return out

  def set_step(self, step: int) -> None:
    """No schedule: the step changes nothing (see data/curriculum.py for one that does)."""
    del step

  def pop_mix(self) -> dict[str, int]:
    """Prompts drawn per task since the last call (the `data/task_mix/<task>` metrics)."""
    out, self._mix = dict(self._mix), collections.Counter()
    return out

  def state(self) -> dict[str, int]:
    """The position, for checkpoints."""
    return {"epoch": self.epoch, "index": self.index}

  def restore(self, state: dict[str, int]) -> None:
    """Continues from a `state()`."""
    self.epoch, self.index = int(state["epoch"]), int(state["index"])
