"""A policy directory: an HF checkpoint, its tokenizer, and its prompt format.

`prompt_format.json` records the tokens put before every prompt (the arith task's
`<|im_start|>`), so that evaluation and further training format prompts the way
the policy was trained.
"""

from __future__ import annotations

import json
import os

from rlhf_jax.models.hf.checkpoint import save_hf_checkpoint
from rlhf_jax.models.hf.metadata import tokenizer_ids

PROMPT_FORMAT_FILE = "prompt_format.json"


def save_policy(directory: str, model, params, tokenizer, prefix_tokens: list[str], *,
                dtype: str | None = None) -> None:
  """Writes an HF checkpoint directory + tokenizer + prompt format.

  A policy loaded from a checkpoint keeps that checkpoint's token ids, generation config
  and dtype (`save_hf_checkpoint`); one built here takes its bos/eos/pad ids from
  `tokenizer`. `dtype` stores the tensors in another dtype.
  """
  save_hf_checkpoint(directory, model, params, dtype=dtype,
                     token_ids=tokenizer_ids(tokenizer, model.config.vocab_size))
  tokenizer.save(directory)
  with open(os.path.join(directory, PROMPT_FORMAT_FILE), "w", encoding="utf-8") as f:
    json.dump({"prefix_tokens": prefix_tokens}, f)


def load_prompt_prefix(directory: str, tokenizer) -> list[int]:
  """Token ids to put before each prompt, from the directory's prompt_format.json
  ([] if there is none)."""
  path = os.path.join(directory, PROMPT_FORMAT_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    tokens = json.load(f)["prefix_tokens"]
  ids = [tokenizer.backend.token_to_id(t) for t in tokens]
  if None in ids:
    raise ValueError(f"{path}: prefix tokens {tokens} are not all in the tokenizer.")
  return ids
