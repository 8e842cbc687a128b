"""Supervised rows from conversations and prompt/completion pairs (data/conversations.py):
the loss mask on the assistant's tokens only, and one-line errors naming the row."""

from __future__ import annotations

import pytest

from rlhf_jax.data.conversations import check_row
from rlhf_jax.data.conversations import supervised_row
from rlhf_jax.data.prompts import PromptFormat
from tests.data.chat_rows import CONVERSATION
from tests.data.chat_rows import chatml_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
  return chatml_tokenizer()


def pieces(tok, row):
  """(trained text, context text) of a row's response, by its mask."""
  trained = [i for i, m in zip(row.response_ids, row.loss_mask) if m]
  context = [i for i, m in zip(row.response_ids, row.loss_mask) if not m]
  return (tok.decode(trained, skip_special_tokens=False),
          tok.decode(context, skip_special_tokens=False))


def test_a_conversation_trains_the_assistant_turns_only(tokenizer):
  row = supervised_row({"messages": CONVERSATION}, "f.jsonl:1", PromptFormat(tokenizer))
  # ChatML by hand: the prompt ends with the first generation prompt; the user turn between
  # the assistant turns is context; the last turn ends with EOS.
  assert tokenizer.decode(row.prompt_ids, skip_special_tokens=False) == (
      "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n")
  trained, context = pieces(tokenizer, row)
  assert trained == "4<|im_end|>\n6<|im_end|>\n<|endoftext|>"
  assert context == "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n"
  assert row.loss_mask[:len(tokenizer.encode("4<|im_end|>\n"))] == [1] * len(
      tokenizer.encode("4<|im_end|>\n"))


def test_prompt_completion_pairs_plain_and_conversational(tokenizer):
  prompts = PromptFormat(tokenizer, system_prompt="Be terse.")
  row = supervised_row({"prompt": "2+2?", "completion": " 4"}, "f:1", prompts)
  assert tokenizer.decode(row.prompt_ids) == "2+2?"  # a plain prompt stays raw text
  assert row.response_ids == tokenizer.encode(" 4") + [tokenizer.eos_id]
  assert row.loss_mask == [1] * len(row.response_ids)
  row = supervised_row({"prompt": CONVERSATION[1:2], "completion": CONVERSATION[2:3]}, "f:2",
                       prompts)
  assert tokenizer.decode(row.prompt_ids, skip_special_tokens=False).startswith(
      "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?")
  assert pieces(tokenizer, row) == ("4<|im_end|>\n<|endoftext|>", "")


def test_rows_that_cannot_train_name_the_row(tokenizer):
  prompts = PromptFormat(tokenizer)
  with pytest.raises(ValueError, match="f:3: no assistant turn to train on"):
    supervised_row({"messages": CONVERSATION[:2]}, "f:3", prompts)
  with pytest.raises(ValueError, match=r"f:4: needs 'messages', or 'prompt' and 'completion'"):
    supervised_row({"text": "x"}, "f:4", prompts)
  row = supervised_row({"messages": CONVERSATION}, "f:5", prompts)
  with pytest.raises(ValueError, match=r"f:5: the response has \d+ tokens, more than "
                                       r"sft.response_length=3"):
    check_row(row, "f:5", prompt_length=64, response_length=3)
