"""The `data` section (data/config.py): its fields checked, one line naming the field; the
chat-template variables parsed from their JSON text; what `read_examples` gets from the
section; and the levels and their weights. (The template variables rendered by a published
template: test_template_kwargs.py.)"""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import config as data_config


def section(**fields):
  d = data_config.data_config()
  for name, value in fields.items():
    d[name] = value
  return d


def test_the_defaults_pass():
  data_config.validate_data_fields(section())


@pytest.mark.parametrize("fields, field, message", [
    ({"num_train": 0}, "num_train", "must be >= 1"),
    ({"train_file": "/nonexistent/train.jsonl"}, "train_file", "must be an existing"),
    ({"answer_format": "latex"}, "answer_format", "must be one of as_is, gsm8k, boxed"),
    ({"template_timeout_s": 0.0}, "template_timeout_s", r"must be in \(0, 3600\] seconds"),
    ({"chat_template": "never", "system_prompt": "Be brief."}, "system_prompt",
     "must be empty with data.chat_template='never'"),
    ({"default_task": "math, code"}, "default_task", "must be one task name"),
    ({"default_task": " math"}, "default_task", "must be one task name"),
])
def test_each_bad_field_is_named(fields, field, message):
  with pytest.raises(ConfigError, match=rf"^config\.data\.{field}: invalid value .*{message}") \
      as error:
    data_config.validate_data_fields(section(**fields))
  assert error.value.field == f"data.{field}"


@pytest.mark.parametrize("text, message", [
    ("[1]", "must be a JSON object of template variables"),
    ("{nope}", r"must be a JSON object, .*\(not JSON: "),
    ('{"2x": 1}', "variable '2x' is not a name a template can read"),
    ('{"messages": []}', "variable 'messages' is set by the renderer itself"),
])
def test_template_variables_must_be_a_json_object_of_names(text, message):
  with pytest.raises(ConfigError, match=rf"^config\.data\.chat_template_kwargs: .*{message}"):
    data_config.template_kwargs(section(chat_template_kwargs=text))


def test_template_variables_parsed():
  assert data_config.template_kwargs(section()) == {}
  assert data_config.template_kwargs(section(chat_template_kwargs=' {"enable_thinking": false,'
                                             ' "depth": [1, 2]} ')) == {
      "enable_thinking": False, "depth": [1, 2]}
  with pytest.raises(ConfigError, match=r"^config\.data\.chat_template_kwargs: .*must be empty "
                                        r"with data\.chat_template='never'"):
    data_config.validate_data_fields(section(chat_template="never",
                                             chat_template_kwargs='{"x": 1}'))


def test_read_options_and_levels():
  options = data_config.read_options(section(columns="prompt=question,answer=solution",
                                             default_task="", answer_format="gsm8k"))
  assert options == {"columns": {"prompt": "question", "answer": "solution"},
                     "default_task": None, "answer_format": "gsm8k"}
  data_config.check_levels("data", (1, 3), (1.0, 2), allowed={1, 2, 3})
  for levels, weights, field, message in [
      ((), (), "data.levels", "must be a non-empty tuple of arith levels, each one of 1, 2, 3"),
      ((4,), (1.0,), "data.levels", "each one of 1, 2, 3"),
      ((1, 2), (1.0,), "data.level_weights", r"must have one weight per data\.levels \(2\)"),
      ((1, 2), (1.0, 0.0), "data.level_weights", "must all be numbers > 0"),
      ((1,), ("1",), "data.level_weights", "must all be numbers > 0")]:
    with pytest.raises(ConfigError, match=rf"^config\.{field}: invalid value .*{message}"):
      data_config.check_levels("data", levels, weights, allowed={1, 2, 3})
