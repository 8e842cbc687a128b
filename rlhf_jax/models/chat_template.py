"""Chat templates: the Jinja `chat_template` of tokenizer_config.json, rendered as
transformers renders it (a sandboxed Jinja environment with `trim_blocks`,
`lstrip_blocks`, loop controls, the `tojson` filter and `raise_exception`), and the text
that appends one turn after a model turn (`turn_suffix`: how a multi-turn rollout renders
a tool's output as a tool turn).

Needs jinja2 (the `hf` extra).
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any, Mapping, Sequence

# The probe conversation `turn_suffix` renders around; any text works, its turns only
# have to exist so that templates that treat the first turn specially are past it.
_PROBE = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})


class ChatTemplateError(ValueError):
  """A template that does not render, or that raised through `raise_exception`."""


@functools.lru_cache(maxsize=16)
def _compile(template: str):
  """The compiled template in transformers' environment."""
  import jinja2  # pylint: disable=import-outside-toplevel
  import jinja2.ext  # pylint: disable=import-outside-toplevel
  from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=import-outside-toplevel

  def raise_exception(message):
    raise ChatTemplateError(f"the chat template refused the messages: {message}")

  def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=[jinja2.ext.loopcontrols])
  environment.filters["tojson"] = tojson
  environment.globals["raise_exception"] = raise_exception
  environment.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
  try:
    return environment.from_string(template)
  except jinja2.TemplateError as error:
    raise ChatTemplateError(f"the chat template does not compile: {error}") from None


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, special_tokens: Mapping[str, Any] = (),
                tools: Sequence[Mapping[str, Any]] | None = None) -> str:
  """The text of `messages` under `template`, as transformers' `apply_chat_template(...,
  tokenize=False)` renders it.

  Args:
    template: the Jinja source (tokenizer_config.json's `chat_template`).
    messages: [{"role": ..., "content": ...}, ...] (more keys pass through: tool calls).
    add_generation_prompt: end with the opening of an assistant turn.
    special_tokens: bos_token, eos_token, ... as the template may use them.
    tools: JSON schemas of the tools, for templates that list them.
  Raises:
    ChatTemplateError: the template does not compile or refused the messages.
  """
  for index, message in enumerate(messages):
    if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
      raise ValueError(f"messages[{index}] needs string 'role' and 'content'; got "
                       f"{sorted(message)}.")
  return _compile(template).render(messages=[dict(m) for m in messages], tools=tools,
                                   add_generation_prompt=add_generation_prompt,
                                   **dict(special_tokens))


def turn_suffix(template: str, role: str, content: str, *, turn_end: str = "",
                special_tokens: Mapping[str, Any] = ()) -> str:
  """The text that follows a model turn ended by `turn_end` (its last token, e.g.
  "<|im_end|>") to add a `role` turn with `content` and open the next assistant turn.

  Rendered by difference: the probe conversation ending in an assistant turn, then the same
  plus the new turn with a generation prompt; the suffix is what the second adds, preceded
  by what the template writes after `turn_end` in the assistant turn (ChatML: "\\n").

  Raises:
    ChatTemplateError: the template renders the longer conversation with another start
      (it cannot be appended to token by token).
  """
  before = render_chat(template, _PROBE, add_generation_prompt=False,
                       special_tokens=special_tokens)
  after = render_chat(template, _PROBE + ({"role": role, "content": content},),
                      add_generation_prompt=True, special_tokens=special_tokens)
  if not after.startswith(before):
    raise ChatTemplateError(f"the chat template renders a {role!r} turn by rewriting the "
                            "turns before it; it cannot be appended to a sampled row.")
  tail = ""
  if turn_end and turn_end in before:
    tail = before[before.rindex(turn_end) + len(turn_end):]
  return tail + after[len(before):]
