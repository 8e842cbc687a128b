"""A conversation and a ChatML tokenizer trained on its words, shared by the tests of the
supervised rows (tests/data/test_conversations.py) and of SFT (tests/algorithms/test_sft.py)."""

from __future__ import annotations

from rlhf_jax import models

CONVERSATION = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3+3?"},
                {"role": "assistant", "content": "6"}]


def chatml_tokenizer():
  """A 300-token BPE tokenizer over CONVERSATION's words, with the ChatML template."""
  tok = models.train_bpe_tokenizer(["Be terse. 2+2? 4 and 3+3? 6 hello"] * 10, vocab_size=300)
  tok.chat_template = models.tokenizer.CHATML_JINJA
  return tok
