"""What the rollout does with an environment's observations before they become tokens, and
how it reports the episodes that failed.

- Budget: an observation may have at most `max_chars_per_token` characters per token left
  in the row (`env.max_chars_per_token`); the worker cuts a longer one before it returns
  (envs/runner.py), and the rollout never tokenises more than that bound. A token of a
  real tokenizer covers ~3–5 characters of prose or code, so a text past 16 per token
  cannot fit; the cut episode ends as truncated, as one whose observation leaves no room.
- Control text: a tool's output rendered as a turn must not carry the template's own
  markers (`<|im_end|><|im_start|>user ...` would be encoded as real turn boundaries by a
  ChatML tokenizer). Every added or special token of the policy's tokenizer found in it is
  escaped: a space after its first character, so it is encoded as plain text.
- Failures: one console line per kind of failure and step (the first reason, with the
  count), and `env/failures/<kind>` counts in the step's metrics.
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Iterable

LOG = logging.getLogger("rlhf_jax.envs")


def control_texts(tokenizer) -> list[str]:
  """The texts of every added / special token of `tokenizer` (a `models.Tokenizer`; its
  HF backend's added-token table), longest first; whitespace-only and one-character ones
  are left out (escaping them would only damage text)."""
  decoder = tokenizer.backend.get_added_tokens_decoder()
  texts = {token.content for token in decoder.values()}
  texts |= set(tokenizer.special_tokens().values())
  return sorted((t for t in texts if len(t) > 1 and t.strip()), key=lambda t: (-len(t), t))


def control_pattern(tokenizer) -> re.Pattern | None:
  """A regex matching any of `control_texts(tokenizer)` (None when there are none)."""
  texts = control_texts(tokenizer)
  return re.compile("|".join(map(re.escape, texts))) if texts else None


def escape_control_text(text: str, pattern: re.Pattern | None) -> tuple[str, int]:
  """`text` with every match of `pattern` broken by a space after its first character,
  and how many there were."""
  if pattern is None:
    return text, 0
  return pattern.subn(lambda m: m.group(0)[0] + " " + m.group(0)[1:], text)


def failure_metrics(failures: Iterable[tuple[str, str]], episodes: int,
                    what: str = "episodes") -> dict[str, float]:
  """`env/failures/<kind>` counts of (kind, reason) pairs, and one warning line per kind
  (its first reason and how many of the step's `episodes` failed so)."""
  counts: collections.Counter = collections.Counter()
  first: dict[str, str] = {}
  for kind, reason in failures:
    counts[kind] += 1
    first.setdefault(kind, reason)
  for kind, count in counts.items():
    LOG.warning("environment failure %s (%d of %d %s): %s", kind, count, episodes, what,
                first[kind][:300])
  return {f"env/failures/{kind}": float(count) for kind, count in sorted(counts.items())}
