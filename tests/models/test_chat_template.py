"""Chat templates (models/chat_template.py): rendered as transformers renders them, loaded
from and saved to tokenizer_config.json, and the text that appends a tool turn after a
model turn."""

import json

import pytest

from rlhf_jax import models
from rlhf_jax.models.chat_template import ChatTemplateError
from rlhf_jax.models.chat_template import render_chat
from rlhf_jax.models.chat_template import turn_suffix

# Qwen2.5-style: a default system turn, tools listed with tojson, tool results folded into
# a user turn in <tool_response> tags (consecutive ones share it), loop controls.
QWEN_STYLE = """{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
{%- if message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role in ['user', 'assistant', 'system'] %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- else %}
{{- raise_exception('unknown role ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
# Block tags on their own indented lines: what trim_blocks and lstrip_blocks decide.
INDENTED = """{% for message in messages %}
  {% if loop.first %}
[{{ message.role }}]
  {% endif %}
{{ message.content }}
{% endfor %}
{% if add_generation_prompt %}>{% endif %}"""
MESSAGES = [{"role": "user", "content": "What is 12 * 34?"},
            {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
            {"role": "tool", "content": "408"}, {"role": "tool", "content": "ok"}]
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "é"}}]
TOKENIZER = models.build_character_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789 ?*\n")


@pytest.mark.parametrize("template", [QWEN_STYLE, INDENTED])
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_rendering_matches_transformers(template, tools, generation_prompt):
  transformers = pytest.importorskip("transformers")
  reference = transformers.PreTrainedTokenizerFast(
      tokenizer_object=TOKENIZER.backend, eos_token="<|endoftext|>", chat_template=template)
  expected = reference.apply_chat_template(MESSAGES, tools=tools, tokenize=False,
                                           add_generation_prompt=generation_prompt)
  assert render_chat(template, MESSAGES, tools=tools,
                     add_generation_prompt=generation_prompt) == expected
  if template == QWEN_STYLE:
    assert "<tool_response>\n408\n</tool_response>\n<tool_response>\nok" in expected


def test_the_template_travels_through_tokenizer_config(tmp_path):
  tokenizer = models.Tokenizer(TOKENIZER.backend, chat_template=QWEN_STYLE)
  tokenizer.save(str(tmp_path))
  assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == (
      QWEN_STYLE)
  loaded = models.Tokenizer.from_directory(str(tmp_path))
  assert loaded.apply_chat_template(MESSAGES[:1]) == (
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  config["chat_template"] = [{"name": "tool_use", "template": "T"},
                             {"name": "default", "template": QWEN_STYLE}]
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  assert models.Tokenizer.from_directory(str(tmp_path)).chat_template == QWEN_STYLE
  # Without a template of its own, the built-in ChatML.
  assert TOKENIZER.chat_template is None
  assert TOKENIZER.apply_chat_template(MESSAGES[:1]) == (
      "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")


def test_a_tool_turn_appends_after_the_models_turn_end():
  assert TOKENIZER.turn_suffix("tool", "408", turn_end="<|im_end|>") == (
      "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")
  suffix = turn_suffix(QWEN_STYLE, "tool", "408", turn_end="<|im_end|>")
  assert suffix == ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
  # Appending the suffix to the model's turn gives the template's whole conversation.
  turn = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
  whole = render_chat(QWEN_STYLE, MESSAGES[:3], add_generation_prompt=True)
  assert whole.endswith(turn + suffix)


def test_templates_that_cannot_be_appended_to_or_refuse_are_errors():
  rewriting = ("{{ messages | length }}:{% for m in messages %}{{ m.content }}{% endfor %}"
               "{% if add_generation_prompt %}>{% endif %}")
  with pytest.raises(ChatTemplateError, match="rewriting the turns before it"):
    turn_suffix(rewriting, "tool", "x")
  with pytest.raises(ChatTemplateError, match="unknown role robot"):
    render_chat(QWEN_STYLE, [{"role": "robot", "content": "x"}])
  with pytest.raises(ChatTemplateError, match="does not compile"):
    render_chat("{% for %}", MESSAGES)
  with pytest.raises(ChatTemplateError, match="failed on the messages: UndefinedError"):
    render_chat("{{ messages[0].content.upper() }}", [{"role": "user"}])
  with pytest.raises(ValueError, match="messages is empty"):
    render_chat(QWEN_STYLE, [])
  with pytest.raises(ValueError, match="messages\\[0\\] needs a string 'role'"):
    render_chat(QWEN_STYLE, [{"content": "x"}])


# What transformers adds to Jinja: {% generation %} blocks (its assistant-token mask),
# `dict`, a namespace that refuses underscore attributes, strftime_now.
EXTENSIONS = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
              "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
              "{{ ns.n }}{{ dict(a=1) | tojson }}{{ strftime_now('%Y')[:2] }}")


def test_transformers_jinja_extensions_render_the_same():
  transformers = pytest.importorskip("transformers")
  reference = transformers.PreTrainedTokenizerFast(tokenizer_object=TOKENIZER.backend,
                                                   eos_token="<|endoftext|>")
  expected = reference.apply_chat_template(MESSAGES, chat_template=EXTENSIONS, tokenize=False)
  assert render_chat(EXTENSIONS, MESSAGES) == expected
  assert expected.startswith("What is 12 * 34?") and '4{"a": 1}20' in expected
  with pytest.raises(ChatTemplateError, match="SecurityError"):
    render_chat("{% set ns = namespace(_x=1) %}", MESSAGES)


def test_messages_are_passed_on_as_transformers_passes_them():
  echo = "{% for m in messages %}{{ m | tojson }}|{% endfor %}{{ enable_thinking }}"
  messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": None},
              {"role": "assistant", "content": None, "reasoning": "r", "tool_calls": [{}]}]
  assert render_chat(echo, messages, enable_thinking=False) == (
      '{"role": "user", "content": [{"type": "text", "text": "hi"}]}|'
      '{"thinking": "r", "role": "assistant", "reasoning": "r", "tool_calls": [{}], '
      '"reasoning_content": "r"}|False')


def test_what_a_template_cannot_be_given_is_refused():
  image = [{"role": "user", "content": [{"type": "text", "text": "see"},
                                        {"type": "image", "url": "x.png"}]}]
  with pytest.raises(ValueError, match=r"\['content'\]\[1\] is a part of type 'image'; only"):
    render_chat(QWEN_STYLE, image)
  with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] is a object"):
    render_chat(QWEN_STYLE, [{"role": "user", "content": object()}])
  with pytest.raises(TypeError, match=r"tools\[0\] is a builtin_function_or_method; tools"):
    render_chat(QWEN_STYLE, MESSAGES, tools=[print])
  with pytest.raises(ValueError, match=r"\['tokenize'\] are not supported here"):
    TOKENIZER.apply_chat_template(MESSAGES[:1], tokenize=True)
