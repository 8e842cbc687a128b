"""Chat templates: what a tokenizer directory gives a template, read with transformers'
precedence (`read_chat_templates`, `read_special_tokens`), rendered as transformers 5
renders it (`render_chat`: its sandboxed environment, globals and filters, and what it
does to the messages first), and the text that appends one turn after a model turn
(`turn_suffix`: how a multi-turn rollout renders a tool's output as a tool turn).

Every compile and render is bounded in time, size and recursion (`template_bounds`: a
template is a checkpoint's code); past a bound it is one ChatTemplateError line.

Needs jinja2 (the `hf` extra).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from rlhf_jax.models import template_bounds as bounds

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
# The processor's legacy file; AutoTokenizer does not read it (see `read_chat_templates`).
LEGACY_TEMPLATE_FILE = "chat_template.json"
# transformers copies a message's reasoning under each of these names (the first is the one
# most templates read: Qwen3's `reasoning_content`; gpt-oss reads `thinking`).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Keys of a content part that carry media; a tokenizer alone cannot render those.
_MEDIA_KEYS = ("image", "image_url", "video", "video_url", "audio", "audio_url", "input_audio")
# Arguments of transformers' apply_chat_template that are not template variables: refused
# here rather than handed to the template, where they would silently do nothing.
_NOT_TEMPLATE_VARIABLES = ("tokenize", "padding", "truncation", "max_length", "return_tensors",
                           "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                           "continue_final_message", "sanitize_control_tokens")
# The probe conversation `turn_suffix` renders around; any text works, its turns only
# have to exist so that templates that treat the first turn specially are past it.
_PROBE = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})


class ChatTemplateError(ValueError):
  """A template that does not render, or that raised through `raise_exception`."""


def read_chat_templates(directory: str, config: Mapping[str, Any]) -> dict[str, str]:
  """The chat templates of a tokenizer directory by name ("default" is the one used
  without a name), with AutoTokenizer's precedence: `chat_template.jinja` ("default") and
  `additional_chat_templates/<name>.jinja` when any exist; else tokenizer_config.json's
  `chat_template` (`config`: a string, or a list of {"name", "template"}); else the
  processor's legacy `chat_template.json`, which AutoTokenizer does not read but
  AutoProcessor does (kept last so a processor checkpoint's template is not lost).
  """
  templates = {}
  if os.path.isfile(os.path.join(directory, TEMPLATE_FILE)):
    templates["default"] = _read_text(os.path.join(directory, TEMPLATE_FILE))
  extra = os.path.join(directory, TEMPLATE_DIR)
  if os.path.isdir(extra):
    for name in sorted(os.listdir(extra)):
      if name.endswith(".jinja"):
        templates[name.removesuffix(".jinja")] = _read_text(os.path.join(extra, name))
  if templates:
    return templates
  template = config.get("chat_template")
  if isinstance(template, str):
    return {"default": template}
  if isinstance(template, list):
    if not all(isinstance(t, dict) and {"name", "template"} <= set(t) for t in template):
      raise ValueError(f"{directory}/tokenizer_config.json: chat_template is a list but not "
                       "of {\"name\": ..., \"template\": ...} entries.")
    return {t["name"]: t["template"] for t in template}
  legacy = os.path.join(directory, LEGACY_TEMPLATE_FILE)
  if os.path.isfile(legacy):
    template = read_json(legacy).get("chat_template")
    if not isinstance(template, str):
      raise ValueError(f"{legacy}: 'chat_template' is not a string.")
    return {"default": template}
  return {}


def template_files(directory: str, templates: Mapping[str, str]) -> dict[str, str]:
  """Template text → the file `read_chat_templates` read it from, for the `templates`
  (by name) of `directory`: what an error names."""
  files = {}
  for name, template in templates.items():
    candidates = [os.path.join(directory, TEMPLATE_FILE)] if name == "default" else []
    candidates += [os.path.join(directory, TEMPLATE_DIR, f"{name}.jinja"),
                   os.path.join(directory, "tokenizer_config.json")]
    files[template] = next((c for c in candidates if os.path.isfile(c)),
                           os.path.join(directory, LEGACY_TEMPLATE_FILE))
  return files


@contextlib.contextmanager
def errors_naming(path: str | None):
  """A ChatTemplateError raised in the block starts with `path` (the checkpoint file the
  template came from; None: left as it is)."""
  try:
    yield
  except ChatTemplateError as error:
    if path is None:
      raise
    raise ChatTemplateError(f"{path}: {error}") from None


def read_special_tokens(directory: str, config: Mapping[str, Any]) -> dict[str, str]:
  """The named special tokens of a tokenizer directory as transformers reads them:
  tokenizer_config.json's (`config`), updated by special_tokens_map.json's only when the
  config has no `added_tokens_decoder` (transformers' legacy path; a config saved since
  transformers 4.34 has one); strings or AddedToken dicts ({"content": ...}); the
  named tokens (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
  mask_token) and any other `*_token` or `extra_special_tokens` name; unset ones left out.
  """
  settings = dict(config)
  if "added_tokens_decoder" not in config:
    settings.update(read_json(os.path.join(directory, "special_tokens_map.json")))
  extra = settings.get("extra_special_tokens")
  if isinstance(extra, dict):
    settings.update(extra)
  named = {}
  for key, value in settings.items():
    text = value.get("content") if isinstance(value, dict) else value
    if key.endswith("_token") and isinstance(text, str):
      named[key] = text
  return named


def read_json(path: str) -> dict[str, Any]:
  """The JSON object in `path` ({} if there is no such file)."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    try:
      value = json.load(f)
    except json.JSONDecodeError as error:  # its message names no file
      raise ValueError(f"{path}:{error.lineno}: not JSON ({error.msg}).") from None
    except RecursionError:
      raise ValueError(f"{path}: JSON nested too deeply to read.") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} does not hold a JSON object.")
  return value


def _read_text(path: str) -> str:
  # Text mode with universal newlines, as transformers opens template files (a CRLF file
  # renders with "\n").
  with open(path, encoding="utf-8") as f:
    return f.read()


@functools.lru_cache(maxsize=1)
def _environment():
  """transformers' Jinja environment: sandboxed, `trim_blocks`, `lstrip_blocks`, loop
  controls, `{% generation %}` blocks, its `tojson`, `raise_exception`, `strftime_now`,
  and its `dict` and `namespace` (no underscore attributes)."""
  import jinja2  # pylint: disable=import-outside-toplevel
  import jinja2.ext  # pylint: disable=import-outside-toplevel
  from jinja2.compiler import CodeGenerator  # pylint: disable=import-outside-toplevel
  from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=import-outside-toplevel

  class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with `a ~ b` (concatenation) checked for size."""

    def visit_Concat(self, node, frame):
      self.write("environment.checked_concat(")
      super().visit_Concat(node, frame)
      self.write(")")

  class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with the size bounds of `template_bounds` on operators and calls."""
    code_generator_class = BoundedCodeGenerator
    intercepted_binops = bounds.INTERCEPTED

    def call_binop(self, context, operator, left, right):
      return bounds.binop(operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # pylint: disable=no-self-argument
      what = f"{getattr(__obj, '__name__', type(__obj).__name__)}()"
      bounds.check_arguments(args, kwargs, what)
      bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
      bounds.check_format(bound_to, what)  # '{:>999999999}'.format(...)
      return bounds.bounded_result(
          ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs), what)

    @staticmethod
    def checked_concat(value):
      return bounds.checked(value, "the ~ operator")

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens
    with it (for a loss mask); the text is the body's."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  class TemplateDict:
    def __call__(self, *args, **kwargs):
      return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
      return dict.fromkeys(*args, **kwargs)

  class TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
      self, args = args[0], args[1:]
      attributes = dict(*args, **kwargs)
      for name in attributes:
        TemplateNamespace.check(name)
      jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name, value):
      TemplateNamespace.check(name)
      jinja2.utils.Namespace.__setitem__(
          self, name, bounds.checked(value, f"namespace attribute {name!r}"))

    @staticmethod
    def check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with '_'.")

  def raise_exception(message):
    raise ChatTemplateError(f"the chat template refused the messages: {message}")

  def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  environment = BoundedSandbox(
      trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols],
      finalize=lambda value: bounds.checked(value, "an output"))
  environment.filters["tojson"] = tojson
  environment.filters.update({name: bounds.bounded_filter(f)
                              for name, f in environment.filters.items()})
  environment.globals["raise_exception"] = raise_exception
  environment.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
  environment.globals["dict"] = TemplateDict()
  environment.globals["namespace"] = TemplateNamespace
  return environment


@functools.lru_cache(maxsize=16)
def _compile(template: str):
  """The compiled template in transformers' environment (call it under a deadline: the
  compile folds constant expressions)."""
  import jinja2  # pylint: disable=import-outside-toplevel
  try:
    return _environment().from_string(template)
  except (jinja2.TemplateError, bounds.TemplateBoundError) as error:
    raise ChatTemplateError(f"the chat template does not compile: {error}") from None


def _plain(value: Any, where: str) -> Any:
  """`value` rebuilt from plain JSON types, as transformers rebuilds all a template sees
  (subclasses of str/int/float and NumPy scalars become the base type). transformers turns
  other objects into a "<TypeName>" placeholder; they are refused here."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  for base in (str, int, float):  # str.__str__ etc.: not an override of the subclass
    if isinstance(value, base):
      return getattr(base, f"__{base.__name__}__")(value)
  if isinstance(value, np.generic):
    return _plain(value.item(), where)
  if isinstance(value, Mapping):
    return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return items if isinstance(value, list) else tuple(items)
  raise ValueError(f"{where} is a {type(value).__name__}; a chat template sees JSON values only.")


def _message(index: int, message: Any) -> dict[str, Any]:
  """messages[index] as the template sees it: None-valued keys dropped (transformers: a
  tool-call turn with content=None renders as one without content), plain values, and the
  reasoning copied under each of its names. Content may be a string, absent, a list of
  text parts (passed on as they are: the template decides) or JSON data (a tool's result);
  parts with media are refused."""
  if not isinstance(message, Mapping):
    raise TypeError(f"messages[{index}] is a {type(message).__name__}; messages are dicts.")
  if not isinstance(message.get("role"), str):
    raise ValueError(f"messages[{index}] needs a string 'role'; got keys {sorted(message)}.")
  content = message.get("content")
  for part_index, part in enumerate(content if isinstance(content, (list, tuple)) else ()):
    if isinstance(part, Mapping) and (part.get("type", "text") != "text"
                                      or any(key in part for key in _MEDIA_KEYS)):
      raise ValueError(f"messages[{index}]['content'][{part_index}] is a part of type "
                       f"{part.get('type', 'media')!r}; only text parts can be rendered "
                       "(a tokenizer has no processor for images, audio or video).")
  message = _plain({k: v for k, v in message.items() if v is not None}, f"messages[{index}]")
  reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
  if reasoning is not None:
    message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
  return message


def check_template_kwargs(template_kwargs: Mapping[str, Any]) -> None:
  """Refuses transformers' apply_chat_template arguments that are not template variables."""
  refused = sorted(set(template_kwargs) & set(_NOT_TEMPLATE_VARIABLES))
  if refused:
    raise ValueError(f"{refused} are not supported here (they are not template variables).")


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, tools: Sequence[Mapping] | None = None,
                documents: Sequence[Mapping] | None = None,
                special_tokens: Mapping[str, Any] = (),
                timeout_s: float = bounds.DEFAULT_TIMEOUT_S, **template_kwargs) -> str:
  """The text of `messages` under `template`, as transformers' `apply_chat_template(...,
  tokenize=False)` renders it, bounded (`template_bounds`).

  Args:
    template: the Jinja source.
    messages: [{"role": ..., "content": ...}, ...]; more keys pass through (tool_calls,
      reasoning_content); see `_message` for what content may be.
    add_generation_prompt: end with the opening of an assistant turn.
    tools: JSON schemas of the tools (transformers also takes Python functions and
      converts them with `get_json_schema`; here they are refused).
    documents: dicts (e.g. {"title", "text"}) for templates that do retrieval.
    special_tokens: bos_token, eos_token, ... (transformers' `special_tokens_map`).
    timeout_s: the most seconds the compile and render may take.
    **template_kwargs: more template variables (enable_thinking, date_string, ...); they
      override `special_tokens` of the same name, as in transformers.
  Raises:
    ChatTemplateError: the template does not compile, fails, refused the messages, or
      went past a bound (time, size, recursion).
  """
  import jinja2  # pylint: disable=import-outside-toplevel
  if not messages:
    raise ValueError("messages is empty; a chat needs at least one message.")
  check_template_kwargs(template_kwargs)
  chat = [_message(i, m) for i, m in enumerate(messages)]
  for name, items in (("tools", tools), ("documents", documents)):
    for index, item in enumerate(items or ()):
      if not isinstance(item, Mapping):
        what = ("JSON schemas (a Python function is not converted here)" if name == "tools"
                else "dicts")
        raise TypeError(f"{name}[{index}] is a {type(item).__name__}; {name} are {what}.")
  variables = _plain({**dict(special_tokens), **template_kwargs}, "template_kwargs")
  pieces, characters = [], 0
  try:
    with bounds.deadline(timeout_s, "the chat template"):
      compiled = _compile(template)
      for piece in compiled.generate(
          messages=chat, tools=_plain(tools and list(tools), "tools"),
          documents=_plain(documents and list(documents), "documents"),
          add_generation_prompt=add_generation_prompt, **variables):
        characters += len(piece)
        if characters > bounds.MAX_CHARS:
          raise bounds.TemplateBoundError(f"the chat template wrote more than "
                                          f"{bounds.MAX_CHARS} characters")
        pieces.append(piece)
  except bounds.TemplateBoundError as error:
    raise ChatTemplateError(str(error)) from None
  except bounds.TemplateTimeout:  # delivered after the block, as it ended (a rare race)
    raise ChatTemplateError(f"the chat template took more than {timeout_s:g} s "
                            "(data.template_timeout_s)") from None
  except (jinja2.TemplateError, TypeError) as error:
    raise ChatTemplateError(f"the chat template failed on the messages: "
                            f"{type(error).__name__}: {error}") from None
  return "".join(pieces)


def turn_suffix(template: str, role: str, content: str, *, turn_end: str = "",
                special_tokens: Mapping[str, Any] = (),
                timeout_s: float = bounds.DEFAULT_TIMEOUT_S, **template_kwargs) -> str:
  """The text that follows a model turn ended by `turn_end` (its last token, e.g.
  "<|im_end|>") to add a `role` turn with `content` and open the next assistant turn.

  Rendered by difference: the probe conversation ending in an assistant turn, then the same
  plus the new turn with a generation prompt; the suffix is what the second adds, preceded
  by what the template writes after `turn_end` in the assistant turn (ChatML: "\\n").
  `template_kwargs` are the template variables of both renders (`render_chat`), so the
  opened assistant turn is the one the prompt's renders open (Qwen3's enable_thinking).

  Raises:
    ChatTemplateError: the template renders the longer conversation with another start
      (it cannot be appended to token by token).
  """
  before = render_chat(template, _PROBE, add_generation_prompt=False,
                       special_tokens=special_tokens, timeout_s=timeout_s, **template_kwargs)
  after = render_chat(template, _PROBE + ({"role": role, "content": content},),
                      add_generation_prompt=True, special_tokens=special_tokens,
                      timeout_s=timeout_s, **template_kwargs)
  if not after.startswith(before):
    raise ChatTemplateError(f"the chat template renders a {role!r} turn by rewriting the "
                            "turns before it; it cannot be appended to a sampled row.")
  tail = ""
  if turn_end and turn_end in before:
    tail = before[before.rindex(turn_end) + len(turn_end):]
  return tail + after[len(before):]
