"""Tool calls: the format each published template writes, and calls parsed back out of
the text that template renders for an assistant's calls (round trip through the real
template, not through our own writer)."""

from __future__ import annotations

import json

import pytest

from rlhf_jax.models import chat_template
from rlhf_jax.models.tokenizer import CHATML_JINJA
from rlhf_jax.sampling.serve import openai_tools as tools
from tests.models.chat_fixtures import template

TOOL = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "the temperature at a place",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}
ARGUMENTS = {"location": "Paris, France", "unit": "celsius"}
# As an OpenAI client sends it back: arguments as a JSON string.
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_current_temperature", "arguments": json.dumps(ARGUMENTS)}}
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


@pytest.mark.parametrize("name,fmt", [("qwen2_5_instruct", tools.HERMES),
                                      ("qwen3", tools.HERMES),
                                      ("llama3_1_instruct", tools.LLAMA3_JSON),
                                      ("llama3_instruct", None)])
def test_the_format_of_each_published_template(name, fmt):
  assert tools.tool_format(template(name)) == fmt
  assert tools.tool_format(CHATML_JINJA) is None


@pytest.mark.parametrize("name,opening,closing", [
    ("qwen2_5_instruct", "<|im_start|>assistant\n", "<|im_end|>"),
    ("llama3_1_instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")])
def test_calls_the_template_writes_parse_back(name, opening, closing):
  messages = tools.template_messages([
      {"role": "user", "content": "What is the temperature in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]}])
  assert messages[1]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
  text = chat_template.render_chat(template(name), messages, add_generation_prompt=False,
                                   tools=[TOOL], special_tokens=SPECIAL)
  sampled = text[text.rindex(opening) + len(opening):text.rindex(closing)]
  content, calls = tools.parse_tool_calls(sampled, tools.tool_format(template(name)))
  assert not content
  assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
          for c in calls] == [("function", "get_current_temperature", ARGUMENTS)]


def test_text_around_hermes_calls_is_content_and_broken_calls_stay_text():
  two = ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
         '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>')
  content, calls = tools.parse_tool_calls(two, tools.HERMES)
  assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["a", "b"]
  assert len({c["id"] for c in calls}) == 2
  for broken in ('<tool_call>\n{"name": "a", "arguments": {</tool_call>',
                 '<tool_call>\n{"name": "a"', "no call at all", '<tool_call>[1]</tool_call>'):
    assert tools.parse_tool_calls(broken, tools.HERMES) == (broken, [])
  assert tools.parse_tool_calls('{"x": 1}', tools.LLAMA3_JSON) == ('{"x": 1}', [])
  python_tag = '<|python_tag|>{"name": "f", "parameters": {"q": "x"}}'
  _, (call,) = tools.parse_tool_calls(python_tag, tools.LLAMA3_JSON)
  assert json.loads(call["function"]["arguments"]) == {"q": "x"}
