"""The prompt of an OpenAI request: text, token ids or messages, each refusal naming its
field; the rendered chat is the tokenizer's own `apply_chat_template`."""

from __future__ import annotations

import types

import pytest

from rlhf_jax.sampling.serve import openai_prompts as prompts
from rlhf_jax.sampling.serve.openai_wire import WireError
from tests.fakes import fake_tokenizer

TOKENIZER = fake_tokenizer()
SERVICE = types.SimpleNamespace(tokenizer=TOKENIZER, tokenize=TOKENIZER.encode)


def test_completion_prompts_as_text_ids_or_a_batch_of_one():
  ids = TOKENIZER.encode("1+1=")
  for body in ({"prompt": "1+1="}, {"prompt": ["1+1="]}, {"prompt": ids},
               {"prompt": [ids]}, {"prompt_token_ids": ids}):
    assert prompts.completion_prompt(SERVICE, body) == ids


@pytest.mark.parametrize("body,field", [
    ({"prompt": "a", "prompt_token_ids": [1]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "a", "best_of": 3}, "best_of"),
    ({"prompt": "a", "add_special_tokens": True}, "add_special_tokens"),
])
def test_completion_refusals_name_their_field(body, field):
  with pytest.raises(WireError) as raised:
    prompts.completion_prompt(SERVICE, body)
  assert raised.value.param == field


def test_chat_prompts_are_the_rendered_template():
  messages = [{"role": "user", "content": [{"type": "text", "text": "2+"},
                                           {"type": "text", "text": "2=?"}]}]
  joined = [{"role": "user", "content": "2+2=?"}]
  assert prompts.chat_prompt(SERVICE, {"messages": messages}) == TOKENIZER.encode(
      TOKENIZER.apply_chat_template(joined, add_generation_prompt=True))
  assert prompts.chat_prompt(SERVICE, {"messages": joined, "add_generation_prompt": False}
                             ) == TOKENIZER.encode(TOKENIZER.apply_chat_template(
                                 joined, add_generation_prompt=False))


@pytest.mark.parametrize("body,field", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "a", "name": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]},
     "tools"),
    ({"messages": [{"role": "user", "content": "a"}],  # ChatML renders no tools
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required"},
     "tool_choice"),
    ({"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": 1},
     "add_generation_prompt"),
])
def test_chat_refusals_name_their_field(body, field):
  with pytest.raises(WireError) as raised:
    prompts.chat_prompt(SERVICE, body)
  assert raised.value.param == field
