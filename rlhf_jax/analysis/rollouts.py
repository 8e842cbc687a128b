"""Reading <workdir>/rollouts.jsonl (`train.log_rollouts`): the samples a run trained on,
as a Markdown table a person can read (launch/rollouts.py, or a notebook)."""

from __future__ import annotations

import json
from typing import Any, Sequence

ROLE_MARKS = {"assistant": "▶", "environment": "◀"}


def read_rollouts(path: str, *, step: int | None = None) -> list[dict[str, Any]]:
  """The records of rollouts.jsonl (those of `step` only, when given)."""
  with open(path, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if step is None or r["step"] == step]


def _cell(text: str, width: int) -> str:
  """One table cell: newlines shown as ⏎, pipes escaped, cut to `width` characters."""
  text = text.replace("\n", "⏎").replace("|", "\\|")
  return text if len(text) <= width else text[:width - 1] + "…"


def rollouts_table(records: Sequence[dict[str, Any]], *, width: int = 120) -> str:
  """A Markdown table, one line per sample: step, reward, trained / total tokens, and
  the turns in order (▶ the model's, ◀ the environment's)."""
  lines = ["| step | reward | trained / tokens | turns |", "| --- | --- | --- | --- |"]
  for r in records:
    turns = " ".join(f"{ROLE_MARKS.get(t['role'], '?')} {t['text']}" for t in r["turns"])
    lines.append(f"| {r['step']} | {r['reward']:.3g} | {sum(r['loss_mask'])} / "
                 f"{len(r['token_ids'])} | {_cell(turns, width)} |")
  return "\n".join(lines) + "\n"
