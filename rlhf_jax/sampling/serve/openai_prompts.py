"""The prompt of an OpenAI request: its body read, and its token ids from text, ids or
messages (the tokenizer's chat template with `add_generation_prompt` and `tools`).

Prompts are encoded as given (no special tokens added: a template writes its own BOS),
one prompt per request. Each refusal is a `WireError` naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from rlhf_jax.sampling.serve.loop import SamplerService
from rlhf_jax.sampling.serve.openai_tools import template_messages
from rlhf_jax.sampling.serve.openai_tools import tool_format
from rlhf_jax.sampling.serve.openai_wire import WireError
from rlhf_jax.sampling.serve.openai_wire import bad
from rlhf_jax.sampling.serve.openai_wire import token_ids


async def read_body(request: web.Request, limit: int) -> Any:
  """The request's JSON; 413 beyond `limit` bytes (the app's client_max_size), 400 for
  anything but JSON."""
  try:
    raw = await request.read()
  except web.HTTPRequestEntityTooLarge:
    raise WireError(413, f"the request body is larger than {limit} bytes",
                    code="body_too_large") from None
  try:
    return json.loads(raw)
  except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
    raise WireError(400, f"malformed JSON: {error}", code="malformed_json") from None


def _encode(service: SamplerService, text: str, field: str) -> list[int]:
  try:
    return service.tokenize(text)
  except ValueError as error:  # no tokenizer, or longer than the cache could hold
    raise bad(field, str(error)) from None
  except Exception as error:  # pylint: disable=broad-except  # tokenizers' own refusals
    # (a character outside a word-level vocabulary, a lone surrogate) are the text's fault
    raise bad(field, f"the tokenizer cannot encode it ({error})") from None


def completion_prompt(service: SamplerService, body: dict[str, Any]) -> list[int]:
  """Token ids of `prompt` (a string, token ids, or a list of one of them) or vLLM's
  `prompt_token_ids`; refuses what this server does not do (echo, suffix, best_of > n)."""
  if body.get("add_special_tokens"):
    raise bad("add_special_tokens", "is not served: prompts are encoded as given")
  if body.get("echo"):
    raise bad("echo", "is not served (only false)")
  if body.get("suffix"):
    raise bad("suffix", "is not served")
  if body.get("best_of") not in (None, body.get("n") or 1):
    raise bad("best_of", "must equal n (no best-of selection)")
  if ("prompt" in body) == ("prompt_token_ids" in body):
    raise bad("prompt", "send exactly one of prompt and prompt_token_ids")
  if "prompt_token_ids" in body:
    return token_ids(body["prompt_token_ids"], "prompt_token_ids")
  prompt = body["prompt"]
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]  # a batch of one
  if isinstance(prompt, str):
    if not prompt:
      raise bad("prompt", "is empty")
    return _encode(service, prompt, "prompt")
  if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
    return token_ids(prompt, "prompt")
  raise bad("prompt", "must be a string or a list of token ids (one prompt per request)")


def _content(message: Any, index: int) -> dict[str, Any]:
  """A message with its content as text (OpenAI's list of text parts joined)."""
  field = f"messages[{index}]"
  if not isinstance(message, dict) or not isinstance(message.get("role"), str):
    raise bad(field, "must be an object with a string 'role'")
  content = message.get("content")
  if isinstance(content, list):
    if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(
        p.get("text"), str) for p in content):
      raise bad(f"{field}.content", "only text parts ({'type': 'text', 'text': ...}) are "
                "served")
    content = "".join(p["text"] for p in content)
  elif content is not None and not isinstance(content, str):
    raise bad(f"{field}.content", "must be a string, a list of text parts or null")
  return {**message, "content": content}


def tool_calls_format(tokenizer, body: dict[str, Any]) -> str | None:
  """The format (openai_tools.HERMES, LLAMA3_JSON) in which the request's `tools` are
  rendered and its samples' calls parsed; None without tools or with tool_choice 'none'."""
  tools, choice = body.get("tools"), body.get("tool_choice")
  if choice not in (None, "auto", "none"):
    raise bad("tool_choice", "must be 'auto', 'none' or absent: the sampler cannot force "
              "a call")
  if tools is None or choice == "none":
    return None
  if not isinstance(tools, list) or not all(
      isinstance(t, dict) and t.get("type") == "function" and isinstance(
          t.get("function"), dict) and isinstance(t["function"].get("name"), str)
      for t in tools):
    raise bad("tools", "must be a list of {'type': 'function', 'function': {'name': ...}}")
  template = None if tokenizer is None else (tokenizer.chat_templates.get("tool_use") or
                                             tokenizer.chat_template)
  fmt = tool_format(template)
  if fmt is None:
    raise bad("tools", "this server's chat template renders no tools (it writes neither "
              "<tool_call> nor Llama 3.1's JSON calls)")
  return fmt


def chat_prompt(service: SamplerService, body: dict[str, Any]) -> list[int]:
  """Token ids of `messages` rendered with the tokenizer's chat template (ChatML without
  one), `add_generation_prompt` (default true), `chat_template_kwargs` and `tools`
  (unless tool_choice is 'none')."""
  tools = body["tools"] if tool_calls_format(service.tokenizer, body) else None
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise bad("messages", "must be a non-empty list of messages")
  messages = template_messages([_content(m, i) for i, m in enumerate(messages)])
  add_generation_prompt = body.get("add_generation_prompt", True)
  if not isinstance(add_generation_prompt, bool):
    raise bad("add_generation_prompt", f"must be true or false; got "
              f"{add_generation_prompt!r}")
  kwargs = body.get("chat_template_kwargs") or {}
  if not isinstance(kwargs, dict):
    raise bad("chat_template_kwargs", "must be an object")
  tokenizer = service.tokenizer
  if tokenizer is None:
    raise bad("messages", "need a server tokenizer (config tokenizer=...); send token ids "
              "to /v1/completions instead")
  try:
    text = tokenizer.apply_chat_template(messages,
                                         add_generation_prompt=add_generation_prompt,
                                         tools=tools, **kwargs)
  except Exception as error:  # pylint: disable=broad-except  # the template's own errors
    raise bad("messages", f"the chat template refused them: {error}") from None
  return _encode(service, text, "messages")
