"""Preference pairs: `prompt`, `chosen`, `rejected` records in JSONL or Parquet.

Reward-model and pairwise-judge training read them (launch/train_rm.py,
launch/train_judge.py). Optional `metadata` (an object) rides along.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable

from rlhf_jax.data.sources import read_records
from rlhf_jax.data.sources import write_records

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  """One comparison: `chosen` is preferred to `rejected` as a response to `prompt`."""
  prompt: str
  chosen: str
  rejected: str
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def parse_pair(record: Any, where: str) -> PreferencePair:
  """A record as a PreferencePair; errors say `where` (file and line) and the field."""
  if not isinstance(record, dict):
    raise ValueError(f"{where}: a pair is a JSON object with {', '.join(PAIR_FIELDS)}; got "
                     f"{type(record).__name__}.")
  for field in PAIR_FIELDS:
    if not isinstance(record.get(field), str):
      raise ValueError(f"{where}: field {field!r} must be a string; got "
                       f"{type(record.get(field)).__name__} (fields: {sorted(record)}).")
  metadata = record.get("metadata") or {}
  if isinstance(metadata, str):  # Parquet keeps it as a JSON string
    metadata = json.loads(metadata)
  return PreferencePair(record["prompt"], record["chosen"], record["rejected"], dict(metadata))


def read_pairs(path: str) -> list[PreferencePair]:
  """The pairs of a .jsonl or .parquet file; errors name the file, line (row) and field."""
  pairs = [parse_pair(record, where) for where, record in read_records(path)]
  if not pairs:
    raise ValueError(f"{path}: no preference pairs (empty file).")
  return pairs


def write_pairs(path: str, pairs: Iterable[PreferencePair]) -> int:
  """Writes pairs as JSONL or Parquet by extension; returns the count."""
  return write_records(path, [dataclasses.asdict(p) for p in pairs])
