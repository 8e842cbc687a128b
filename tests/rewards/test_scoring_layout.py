"""Reward models read a chat prompt through their own chat template (ScoringLayout)."""

import dataclasses

import numpy as np

from rlhf_jax import models
from rlhf_jax.data import Example
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.tasks import arith

TOKENIZER = arith.tokenizer()


def test_a_reward_model_reads_a_chat_prompt_through_its_own_template():
  chatml = models.build_character_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789 ?+:\n")
  chatml.chat_template = models.tokenizer.CHATML_JINJA
  layout = ScoringLayout(chatml, prefix=(), prompt_length=64, response_length=8)
  chat = Example("2+2?", "4", "math", messages=[{"role": "system", "content": "be terse"},
                                                 {"role": "user", "content": "2+2?"}])
  batch, failures = layout.encode([chat, "2+2?"], ["4", "4"])
  assert failures == ["", ""]
  rendered = "<|im_start|>system\nbe terse<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n" \
             "<|im_start|>assistant\n"
  prompt_width = 64
  rows = np.asarray(batch.tokens)[:, :prompt_width]
  masks = np.asarray(batch.attention_mask)[:, :prompt_width] > 0
  assert list(rows[0][masks[0]]) == chatml.encode(rendered)
  assert list(rows[1][masks[1]]) == chatml.encode("2+2?")  # text stays text
  # 'never' gives the last user turn; a tokenizer without a template fails that row only
  never = dataclasses.replace(layout, chat_template="never")
  assert never.prompt_text(chat) == "2+2?"
  _, failures = ScoringLayout(TOKENIZER, prefix=(), prompt_length=64,
                              response_length=8).encode([chat, "1+1"], ["2", "2"])
  assert "no chat template" in failures[0] and failures[1] == ""
