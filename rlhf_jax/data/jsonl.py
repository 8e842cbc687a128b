"""Prompt data as JSONL, one example per line, and a resumable prompt stream.

Schema (training and evaluation alike):
  {"prompt": str, "answer": str, "task": str, "metadata": {...}, "messages": [...]}
  (metadata and messages optional). Parquet files, other schemas and column mappings:
  data/sources.py.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from rlhf_jax.data.example import Example
from rlhf_jax.data.example import record_to_example
from rlhf_jax.data.example import to_record


def json_lines(path: str) -> Iterator[tuple[int, Any]]:
  """(1-based line number, parsed value) of each non-blank line; a line that is not UTF-8
  text (undecodable bytes, a torn multi-byte character), not JSON, or JSON nested too
  deeply for the parser is a ValueError naming the file and line."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file.")
  with open(path, "rb") as f:  # decoded line by line, so an error can name its line
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as error:
        raise ValueError(f"{path}:{number}: not UTF-8 text (byte {error.start + 1} of the "
                         f"line: {raw[error.start:error.start + 4]!r}).") from None
      if line.strip():
        try:
          yield number, json.loads(line)
        except json.JSONDecodeError as error:
          raise ValueError(f"{path}:{number}: not JSON ({error.msg}).") from None
        except RecursionError:
          raise ValueError(f"{path}:{number}: JSON nested too deeply to read.") from None


def read_jsonl(path: str) -> list[Example]:
  """Reads examples of our schema strictly (string answers, no other fields); errors name
  the file, line and field. `sources.read_examples` also takes numbers and mappings."""
  return [example for _, example in located_jsonl(path)]


def located_jsonl(path: str) -> list[tuple[str, Example]]:
  """`read_jsonl`, each example with where it is ("f.jsonl:3"), for checks naming the row."""
  located = [(f"{path}:{number}", record_to_example(record, f"{path}:{number}", strict=True,
                                                    numbers=False))
             for number, record in json_lines(path)]
  if not located:
    raise ValueError(f"{path}: no examples (empty file).")
  return located


def write_jsonl(path: str, examples: Iterable[Example | dict]) -> int:
  """Writes examples (Example or dict records); returns the count."""
  count = 0
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for example in examples:
      if isinstance(example, Example):
        record = to_record(example)
      else:
        record = {k: v for k, v in example.items() if k != "messages" or v is not None}
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
    """Prompts drawn per task since the last call (the `data/task_mix/<task>` metrics; a
    rollout may `take` more than once a step)."""
    out, self._mix = dict(self._mix), collections.Counter()
    return out

  def state(self) -> dict[str, int]:
    """The position, for checkpoints."""
    return {"epoch": self.epoch, "index": self.index}

  def restore(self, state: dict[str, int]) -> None:
    """Continues from a `state()`."""
    if "epoch" not in state:
      raise ValueError(f"not a PromptStream state (keys {sorted(state)}); a checkpoint of a "
                       "run with data.curriculum resumes only with one.")
    self.epoch, self.index = int(state["epoch"]), int(state["index"])
