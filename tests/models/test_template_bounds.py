"""A checkpoint's chat template is rendered with a time, size and recursion bound
(models/template_bounds.py): each of the red team's templates is one ChatTemplateError
line, quickly, naming the file it came from; templates within the bounds render as
before (the parity tests against transformers: test_chat_template_parity.py)."""

from __future__ import annotations

import json
import time

import pytest

from rlhf_jax import models
from rlhf_jax.models import template_bounds
from rlhf_jax.models.chat_template import ChatTemplateError
from rlhf_jax.models.chat_template import render_chat
from tests.models.hostile_templates import HOSTILE

MESSAGES = [{"role": "user", "content": "hi"}]
BIG = template_bounds.MAX_CHARS


@pytest.mark.parametrize("template,message", [pytest.param(t, m, id=c) for c, t, m in HOSTILE])
def test_a_hostile_template_is_one_line_at_once(template, message):
  start = time.thread_time()  # this thread's CPU seconds: other processes' load adds none
  with pytest.raises(ChatTemplateError, match=message) as error:
    render_chat(template, MESSAGES)
  assert "\n" not in str(error.value)
  assert time.thread_time() - start < 3.0


def test_a_template_past_its_deadline_is_stopped():
  loops = "{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}"
  start, cpu = time.perf_counter(), time.thread_time()
  with pytest.raises(ChatTemplateError, match=r"took more than 0.5 s \(data.template_timeout_s"):
    render_chat(loops, MESSAGES, timeout_s=0.5)
  assert time.perf_counter() - start >= 0.5  # the deadline is wall-clock time
  # Stopped soon after it: the render's CPU seconds, which other processes' load does not
  # inflate (on a loaded machine the watchdog may wake late, but the render ran less).
  assert time.thread_time() - cpu < 2.0
  # the watchdog disarmed: later renders, quick ones and in a row, are not interrupted
  for _ in range(200):
    assert render_chat("{{ messages[0].content }}", MESSAGES, timeout_s=0.05) == "hi"


def test_values_up_to_the_bounds_render():
  template = "{{ 'ab' * n }}{{ ('x' ~ 'y')|center(60000)|length }}{{ '%5d' % 7 }}"
  out = render_chat(template, MESSAGES, n=BIG // 4)
  assert out == "ab" * (BIG // 4) + "60000" + "    7"


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_the_error_names_the_checkpoint_file(tmp_path, where):
  tokenizer = models.train_bpe_tokenizer(["hello world"] * 10, vocab_size=280)
  tokenizer.chat_template = "{{ 'a' * 3000000000 }}"
  tokenizer.save(str(tmp_path))
  if where == "chat_template.jinja":  # written where transformers 5 writes it
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "chat_template.jinja").write_text(config.pop("chat_template"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  loaded = models.Tokenizer.from_directory(str(tmp_path))
  with pytest.raises(ChatTemplateError, match=f"^{tmp_path / where}: the chat template "
                                              "repeats a value"):
    loaded.apply_chat_template(MESSAGES)
  with pytest.raises(ChatTemplateError, match=f"^{tmp_path / where}: "):
    loaded.turn_suffix("tool", "42", turn_end="<|im_end|>")
