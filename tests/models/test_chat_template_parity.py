"""Parity with transformers on published chat templates (Qwen2.5-Instruct, Llama 3 and 3.1
Instruct, Qwen3; tests/models/templates/README.md says where each text comes from): the
same text and the same token ids from `Tokenizer.from_directory` as from transformers'
`AutoTokenizer.from_pretrained` on one directory, with tools, tool calls, the `ipython`
role, thinking on and off, and template variables."""

import copy

import pytest

from rlhf_jax import models
from rlhf_jax.models.chat_template import ChatTemplateError
from tests.models.chat_fixtures import assert_parity
from tests.models.chat_fixtures import write_checkpoint

transformers = pytest.importorskip("transformers")

TEMPERATURE = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get the current temperature.",
    "parameters": {"type": "object", "required": ["location"], "properties": {
        "location": {"type": "string", "description": "City, Country"}}}}}
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Évalue une expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}
CALL = {"type": "function", "function": {"name": "get_current_temperature",
                                         "arguments": {"location": "Paris, France"}}}
ASK = {"role": "user", "content": "What is the temperature in Paris right now?"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant.  "}
# An assistant turn that only calls a tool (content None, as OpenAI-style APIs return it).
CALLING = {"role": "assistant", "content": None, "tool_calls": [CALL]}
ANSWER = {"role": "assistant", "content": "It is 22.5 degrees."}


NAMES = ("qwen2_5_instruct", "llama3_instruct", "llama3_1_instruct", "qwen3")


@pytest.fixture(scope="module")
def load(tmp_path_factory):
  """name -> (ours, transformers') for one published template (Qwen3's in
  chat_template.jinja, the others in tokenizer_config.json), built once."""
  loaded = {}

  def load_one(name):
    if name not in loaded:
      where = "jinja" if name == "qwen3" else "config"
      directory = str(write_checkpoint(tmp_path_factory.mktemp(name), name, template_in=where))
      loaded[name] = (models.Tokenizer.from_directory(directory),
                      transformers.AutoTokenizer.from_pretrained(directory))
    return loaded[name]
  return load_one


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_a_plain_chat_matches(load, name, generation_prompt):
  ours, reference = load(name)
  assert ours.special_tokens() == reference.special_tokens_map
  # As OpenAI-style APIs return it: transformers drops the None (Llama 3.1's template
  # would take the key for a tool call).
  answer = {**ANSWER, "tool_calls": None}
  messages = [SYSTEM, ASK, answer, {"role": "user", "content": "  And tomorrow?\n"}]
  assert_parity(ours, reference, messages, add_generation_prompt=generation_prompt)
  assert_parity(ours, reference, messages[1:2], add_generation_prompt=generation_prompt)


@pytest.mark.parametrize("name", ["qwen2_5_instruct", "llama3_1_instruct", "qwen3"])
def test_tools_and_tool_calls_match(load, name):
  ours, reference = load(name)
  role = "ipython" if name == "llama3_1_instruct" else "tool"
  messages = [SYSTEM, ASK, CALLING, {"role": role, "content": "22.5"}, ANSWER]
  for tools in ([TEMPERATURE], [TEMPERATURE, CALCULATOR]):
    assert_parity(ours, reference, messages, tools=tools, add_generation_prompt=False)
    assert_parity(ours, reference, messages[1:4], tools=tools, add_generation_prompt=True)


@pytest.mark.parametrize("name", ["llama3_instruct", "llama3_1_instruct"])
def test_llama3_writes_one_bos_and_transformers_adds_none_when_tokenizing(load, name):
  ours, reference = load(name)
  text, ids = assert_parity(ours, reference, [ASK], add_generation_prompt=True)
  bos = ours.backend.token_to_id("<|begin_of_text|>")
  assert text.startswith("<|begin_of_text|><|start_header_id|>")
  assert ids[0] == bos and ids.count(bos) == 1
  assert ours.special_tokens()["bos_token"] == reference.bos_token == "<|begin_of_text|>"
  # What apply_chat_template(tokenize=True) avoids: tokenizing with special tokens would
  # put the tokenizer's own BOS before the template's.
  assert reference(text)["input_ids"][:2] == [bos, bos]


def test_llama3_1_variables_ipython_and_builtin_tools_match(load):
  ours, reference = load("llama3_1_instruct")
  text, _ = assert_parity(ours, reference, [ASK], add_generation_prompt=True)
  assert "Today Date: 26 Jul 2024" in text
  text, _ = assert_parity(ours, reference, [SYSTEM, ASK], add_generation_prompt=True,
                          date_string="25 Nov 2026")
  assert "Today Date: 25 Nov 2026" in text
  messages = [ASK, CALLING, {"role": "tool", "content": {"temperature": 22.5}}, ANSWER]
  text, _ = assert_parity(ours, reference, messages, tools=[TEMPERATURE],
                          tools_in_user_message=False, add_generation_prompt=True)
  assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temperature": 22.5}' in text
  search = {"role": "assistant", "tool_calls": [{"function": {
      "name": "brave_search", "arguments": {"query": "Paris weather"}}}]}
  text, _ = assert_parity(ours, reference, [ASK, search, {"role": "ipython", "content": "22"}],
                          builtin_tools=["brave_search", "wolfram_alpha"],
                          add_generation_prompt=True)
  assert '<|python_tag|>brave_search.call(query="Paris weather")<|eom_id|>' in text
  two_calls = {"role": "assistant", "tool_calls": [CALL, CALL]}
  with pytest.raises(ChatTemplateError, match="only supports single tool-calls"):
    ours.apply_chat_template([ASK, two_calls], tools=[TEMPERATURE])
  with pytest.raises(Exception, match="only supports single tool-calls"):
    reference.apply_chat_template([ASK, two_calls], tools=[TEMPERATURE], tokenize=False)


@pytest.mark.parametrize("thinking", [None, True, False])
def test_qwen3_thinking_switch_matches(load, thinking):
  ours, reference = load("qwen3")
  kwargs = {} if thinking is None else {"enable_thinking": thinking}
  text, _ = assert_parity(ours, reference, [ASK], add_generation_prompt=True, **kwargs)
  assert text.endswith("<think>\n\n</think>\n\n") == (thinking is False)


def test_qwen3_earlier_thinking_turns_and_tool_calls_match(load):
  ours, reference = load("qwen3")
  earlier = {"role": "assistant", "content": "<think>\nIt is warm.\n</think>\n\nAbout 20."}
  reasoned = {"role": "assistant", "content": "22.5 degrees.", "reasoning_content": "Look."}
  string_arguments = {"role": "assistant", "content": "Let me check.", "tool_calls": [
      {"function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}, CALL]}
  messages = [SYSTEM, ASK, earlier, {"role": "user", "content": "And in Lyon?"},
              string_arguments, {"role": "tool", "content": "4"},
              {"role": "tool", "content": "22.5"}, reasoned]
  for thinking in (True, False):
    text, _ = assert_parity(ours, reference, messages, tools=[TEMPERATURE, CALCULATOR],
                            enable_thinking=thinking, add_generation_prompt=False)
    # The earlier turn's thinking is dropped; the one after the last question is kept.
    assert "It is warm" not in text and "<think>\nLook.\n</think>\n\n22.5 degrees." in text
  # transformers copies `thinking` (and `reasoning`) to `reasoning_content`.
  aliased = [ASK, {"role": "assistant", "content": "Hi.", "thinking": "Greet."}]
  text, _ = assert_parity(ours, reference, aliased, add_generation_prompt=False)
  assert "<think>\nGreet.\n</think>" in text
  assert_parity(ours, reference, messages[:5] + [CALLING], add_generation_prompt=False)


@pytest.mark.parametrize("name", NAMES)
def test_content_as_text_parts_matches(load, name):
  # transformers hands a list of parts to the template as it is, and the template decides:
  # Qwen3's renders non-string content as "", Llama's `| trim` the list's Python repr,
  # Qwen2.5's `+` fails. The same here.
  ours, reference = load(name)
  parts = {"role": "user", "content": [{"type": "text", "text": "What is the temperature?"}]}
  try:
    reference.apply_chat_template([parts], tokenize=False, add_generation_prompt=True)
  except Exception:  # pylint: disable=broad-except
    assert name == "qwen2_5_instruct"
    with pytest.raises(ChatTemplateError, match="failed on the messages: TypeError"):
      ours.apply_chat_template([parts])
  else:
    assert_parity(ours, reference, [SYSTEM, parts], add_generation_prompt=True)


def test_rendering_leaves_the_messages_as_they_were(load):
  ours, _ = load("qwen3")
  messages = [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL],
                    "thinking": "x"}]
  before = copy.deepcopy(messages)
  ours.apply_chat_template(messages, add_generation_prompt=False)
  assert messages == before
