"""Labelled response groups: the offline data of DPO and DQO.

Two record shapes, JSONL or Parquet:
  * labelled samples (launch/label_samples.py writes them): `prompt`, `answer`, `task`,
    `responses` (a list of texts), `scores` (one per response), optional `correct`
    (bools; default score > 0) and `messages` (the chat prompt, rendered with the chat
    template when the groups are encoded, as the samples were drawn);
  * preference pairs (data/pairs.py): `prompt`, `chosen`, `rejected`, read as a group
    of two with scores 1 and 0.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable

from rlhf_jax.data.example import Example
from rlhf_jax.data.example import is_chat
from rlhf_jax.data.pairs import PAIR_FIELDS
from rlhf_jax.data.pairs import PreferencePair
from rlhf_jax.data.pairs import parse_pair
from rlhf_jax.data.sources import read_records
from rlhf_jax.data.sources import write_records


@dataclasses.dataclass(frozen=True)
class LabelledGroup:
  """Responses to one prompt with their scores (a verifier's or a preference's)."""
  example: Example
  responses: tuple[str, ...]
  scores: tuple[float, ...]
  correct: tuple[bool, ...]

  @property
  def task(self) -> str:
    """The example's task (streams count task mixes)."""
    return self.example.task

  @staticmethod
  def from_pair(pair: PreferencePair) -> "LabelledGroup":
    """A pair as the group (chosen, rejected) with scores (1, 0)."""
    return LabelledGroup(Example(pair.prompt, "", "", dict(pair.metadata)),
                         (pair.chosen, pair.rejected), (1.0, 0.0), (True, False))

  def best_and_worst(self) -> "LabelledGroup | None":
    """The group reduced to its highest- and lowest-scored responses (the first of
    equals), or None when every score is equal (no preference)."""
    best = max(range(len(self.scores)), key=lambda i: (self.scores[i], -i))
    worst = min(range(len(self.scores)), key=lambda i: (self.scores[i], i))
    if self.scores[best] == self.scores[worst]:
      return None
    pick = (best, worst)
    return LabelledGroup(self.example, tuple(self.responses[i] for i in pick),
                         tuple(self.scores[i] for i in pick),
                         tuple(self.correct[i] for i in pick))


def _group(record: Any, where: str) -> LabelledGroup:
  if isinstance(record, dict) and all(field in record for field in PAIR_FIELDS):
    return LabelledGroup.from_pair(parse_pair(record, where))
  if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
    raise ValueError(f"{where}: a record is a JSON object with prompt + responses + scores "
                     f"(labelled samples) or {', '.join(PAIR_FIELDS)} (a pair).")
  responses, scores = record.get("responses"), record.get("scores")
  if (not isinstance(responses, list) or not responses
      or not all(isinstance(r, str) for r in responses)):
    raise ValueError(f"{where}: field 'responses' must be a non-empty list of strings "
                     f"(fields: {sorted(record)}).")
  if not isinstance(scores, list) or len(scores) != len(responses):
    raise ValueError(f"{where}: field 'scores' must be a list of {len(responses)} numbers, "
                     "one per response.")
  correct = record.get("correct") or [float(s) > 0 for s in scores]
  if len(correct) != len(responses):
    raise ValueError(f"{where}: field 'correct' must have {len(responses)} entries.")
  metadata = record.get("metadata") or {}
  if isinstance(metadata, str):  # Parquet keeps it as a JSON string
    metadata = json.loads(metadata)
  messages = record.get("messages")
  if messages is not None and not is_chat(messages):
    raise ValueError(f"{where}: field 'messages' must be a list of "
                     "{'role': str, 'content': str} objects.")
  example = Example(record["prompt"], str(record.get("answer", "")), str(record.get("task", "")),
                    dict(metadata), messages)
  return LabelledGroup(example, tuple(responses), tuple(float(s) for s in scores),
                       tuple(bool(c) for c in correct))


def read_labelled(path: str) -> list[LabelledGroup]:
  """The groups of a .jsonl or .parquet file of labelled samples or pairs; errors name the
  file, line (row) and field."""
  groups = [_group(record, where) for where, record in read_records(path)]
  if not groups:
    raise ValueError(f"{path}: no labelled samples or pairs (empty file).")
  return groups


def write_labelled(path: str, groups: Iterable[LabelledGroup]) -> int:
  """Writes labelled-sample records (JSONL or Parquet by extension); returns the count."""
  records = []
  for g in groups:
    record = {"prompt": g.example.prompt, "answer": g.example.answer, "task": g.example.task,
              "responses": list(g.responses), "scores": list(g.scores),
              "correct": list(g.correct), "metadata": g.example.metadata}
    if g.example.messages is not None:  # the chat prompt the samples were drawn for
      record["messages"] = [dict(m) for m in g.example.messages]
    records.append(record)
  return write_records(path, records)
