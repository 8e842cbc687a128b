"""Chat-template variables (`data.chat_template_kwargs`): Qwen3's published template
rendered with enable_thinking=False exactly as transformers' apply_chat_template(...,
enable_thinking=False) renders and tokenises it, through the prompt format every
rollout and evaluation uses and through SFT's conversation rows; a bad value is one line
naming the field; and plain-string prompts sent raw to a checkpoint with a template get
one console line under data.chat_template='auto'."""

import json
import logging

import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import config as data_config_lib
from rlhf_jax.data.conversations import supervised_row
from rlhf_jax.training import build
from rlhf_jax.training import inputs
from rlhf_jax.training.config import base_config
from tests.models.chat_fixtures import write_checkpoint

transformers = pytest.importorskip("transformers")

CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the temperature in Paris right now?"}]
NO_THINKING = '{"enable_thinking": false}'


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  return str(write_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3"))


def hf_config_with(**data):
  c = base_config("hf")
  for key, value in data.items():
    c.data[key] = value
  return c


def transformers_render(directory, messages, **kwargs):
  reference = transformers.AutoTokenizer.from_pretrained(directory)
  text = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                       **kwargs)
  ids = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=False, **kwargs)
  return text, list(ids)


def test_enable_thinking_reaches_the_prompts_as_transformers_renders_them(qwen3_dir):
  tokenizer = models.Tokenizer.from_directory(qwen3_dir)
  example = Example("", "", "math", messages=CHAT)
  default = build.prompt_format(hf_config_with(), tokenizer, [])
  prompts = build.prompt_format(hf_config_with(chat_template_kwargs=NO_THINKING), tokenizer, [])
  assert prompts.template_kwargs == {"enable_thinking": False}
  text, ids = transformers_render(qwen3_dir, CHAT, enable_thinking=False)
  assert prompts.text(example) == text and prompts.encode(example) == ids
  assert text.endswith("<think>\n\n</think>\n\n")  # what the variable changes in Qwen3
  assert default.text(example) == transformers_render(qwen3_dir, CHAT)[0] != text


def test_sft_conversations_render_with_the_variables(qwen3_dir):
  tokenizer = models.Tokenizer.from_directory(qwen3_dir)
  prompts = build.prompt_format(hf_config_with(chat_template_kwargs=NO_THINKING), tokenizer, [])
  row = supervised_row({"messages": CHAT + [{"role": "assistant", "content": "22 degrees."}]},
                       "sft.jsonl:1", prompts)
  assert row.prompt_ids == transformers_render(qwen3_dir, CHAT, enable_thinking=False)[1]


@pytest.mark.parametrize("value, says", [
    ("enable_thinking=False", "must be a JSON object"),
    ("[1, 2]", "must be a JSON object of template variables"),
    ('{"tokenize": true}', "not template variables"),
    ('{"add_generation_prompt": false}', "set by the renderer itself"),
    ('{"not a name": 1}', "not a name a template can read"),
])
def test_a_bad_value_is_one_line_naming_the_field(value, says):
  c = hf_config_with(chat_template_kwargs=value)
  with pytest.raises(ConfigError, match=r"^config\.data\.chat_template_kwargs: invalid value "
                     ) as error:
    data_config_lib.validate_data_fields(c.data)
  assert says in str(error.value) and "\n" not in str(error.value)
  c = hf_config_with(chat_template_kwargs=NO_THINKING, chat_template="never")
  with pytest.raises(ConfigError, match=r"^config\.data\.chat_template_kwargs: .*'never'"):
    data_config_lib.validate_data_fields(c.data)


def test_plain_prompts_sent_raw_to_a_chat_model_get_one_console_line(qwen3_dir, tmp_path,
                                                                      caplog):
  path = tmp_path / "gsm8k.jsonl"
  path.write_text("".join(json.dumps({"question": q, "answer": "#### 5"}) + "\n"
                          for q in ("2+3?", "1+4?", "0+5?")))
  tokenizer = models.Tokenizer.from_directory(qwen3_dir)
  fields = dict(train_file=str(path), columns="prompt=question", answer_format="gsm8k",
                default_task="math")
  c = hf_config_with(**fields)
  prompts = build.prompt_format(c, tokenizer, [])
  with caplog.at_level(logging.WARNING):
    inputs.load_examples(c, prompts)
    inputs.load_examples(c, prompts)  # the trainer reads the data again: said once
  notes = [r.getMessage() for r in caplog.records if "plain strings" in r.getMessage()]
  assert notes == [f"config.data.train_file={path}: 3 of 3 prompts are plain strings, sent "
                   "to the model raw although its checkpoint has a chat template "
                   "(data.chat_template='auto'); --config.data.chat_template=always renders "
                   "each as a user turn"]
  caplog.clear()
  c = hf_config_with(chat_template="always", **fields)
  with caplog.at_level(logging.WARNING):
    inputs.load_examples(c, build.prompt_format(c, tokenizer, []))
  assert not [r for r in caplog.records if "plain strings" in r.getMessage()]


# ChatML whose generation prompt reads enable_thinking as Qwen3's does, and which appends a
# turn without rewriting the earlier ones (Qwen3's own drops the last answer's think block
# once a turn follows it, so a sampled row cannot be extended under it).
APPENDABLE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


def test_a_multi_turn_tool_turn_opens_the_assistant_turn_with_the_variables(tmp_path):
  """The suffix a multi-turn rollout appends after a tool's output is transformers' render
  of the longer conversation minus the shorter one, both with enable_thinking=False."""
  tokenizer = models.train_bpe_tokenizer(["tool output 408", "x y"] * 20, vocab_size=300)
  tokenizer.chat_template = APPENDABLE
  tokenizer.save(str(tmp_path))
  tokenizer = models.Tokenizer.from_directory(str(tmp_path))
  reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
  before = reference.apply_chat_template(probe, tokenize=False, enable_thinking=False)
  after = reference.apply_chat_template(probe + [{"role": "tool", "content": "408"}],
                                        tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
  assert after.startswith(before)
  expected = before[before.rindex("<|im_end|>") + len("<|im_end|>"):] + after[len(before):]
  kwargs = build.prompt_format(hf_config_with(chat_template_kwargs=NO_THINKING), tokenizer,
                               []).template_kwargs
  suffix = tokenizer.turn_suffix("tool", "408", turn_end="<|im_end|>", template_kwargs=kwargs)
  assert suffix == expected and suffix.endswith("<think>\n\n</think>\n\n")
  assert tokenizer.turn_suffix("tool", "408", turn_end="<|im_end|>") != suffix
