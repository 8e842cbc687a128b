"""Reading <workdir>/rollouts.jsonl (`train.log_rollouts`): the samples a run trained on,
as a Markdown table a person can read (launch/rollouts.py, or a notebook)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from rlhf_jax.config_errors import ConfigError

ROLE_MARKS = {"assistant": "▶", "environment": "◀"}


def read_rollouts(path: str, *, step: int | None = None) -> list[dict[str, Any]]:
  """The records of rollouts.jsonl (those of `step` only, when given). A last line
  without its newline is one a live run is writing, or a crash tore: left out, as a
  resume drops it; a complete line that is not UTF-8 JSON with a step is a ConfigError
  naming the file and line."""
  if not os.path.exists(path):
    raise ConfigError(f"{path}: no such file (is it a run with train.log_rollouts > 0?)")
  with open(path, "rb") as f:  # decoded line by line, so an error can name its line
    lines = f.read().split(b"\n")
  records = []
  for number, line in enumerate(lines[:-1], 1):  # the last piece: "" or a torn line
    if not line.strip():
      continue
    try:
      record = json.loads(line.decode("utf-8"))
      if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError("no integer 'step'")
    except (ValueError, RecursionError) as error:
      raise ConfigError(f"{path}:{number}: not a rollout record ({error})") from None
    records.append(record)
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
