"""Preference pairs: `prompt`, `chosen`, `rejected` records in JSONL or Parquet.

Reward-model and pairwise-judge training read them (launch/train_rm.py,
launch/train_judge.py). Optional `metadata` (an object) rides along.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable

from rlhf_jax.data.jsonl import json_lines

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  """One comparison: `chosen` is preferred to `rejected` as a response to `prompt`."""
  prompt: str
  chosen: str
  rejected: str
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def _pair(record: Any, where: str) -> PreferencePair:
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
  from rlhf_jax.data.sources import _pyarrow, _suffix  # pylint: disable=import-outside-toplevel
  suffix = _suffix(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file.")
  if suffix == ".parquet":
    records = _pyarrow().parquet.read_table(path).to_pylist()
    pairs = [_pair(r, f"{path}: row {i}") for i, r in enumerate(records)]
  else:
    pairs = [_pair(r, f"{path}:{n}") for n, r in json_lines(path)]
  if not pairs:
    raise ValueError(f"{path}: no preference pairs (empty file).")
  return pairs


def write_pairs(path: str, pairs: Iterable[PreferencePair]) -> int:
  """Writes pairs as JSONL or Parquet by extension; returns the count."""
  from rlhf_jax.data.sources import _pyarrow, _suffix  # pylint: disable=import-outside-toplevel
  records = [dataclasses.asdict(p) for p in pairs]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if _suffix(path) == ".parquet":
    pa = _pyarrow()
    rows = [dict(r, metadata=json.dumps(r["metadata"])) for r in records]
    pa.parquet.write_table(pa.Table.from_pylist(rows), path)
  else:
    with open(path, "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")
  return len(records)
