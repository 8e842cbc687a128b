"""Tool calls in chat completions: which format the chat template speaks, the calls parsed
back out of a sampled text, and the client's calls made ready for the template.

Two families, as their published templates write a call:
  hermes       Qwen2.5 / Qwen3 / Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}
               \\n</tool_call>`, any number, with text around them;
  llama3_json  Llama 3.1 / 3.2: the whole message one JSON object {"name": ...,
               "parameters": {...}}, after an optional `<|python_tag|>`.
A text that opens a call it does not close, or whose JSON does not parse, is left as
content (the model's output, unchanged), never dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

HERMES = "hermes"
LLAMA3_JSON = "llama3_json"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def tool_format(template: str | None) -> str | None:
  """The tool-call format a chat template's text writes (`HERMES`, `LLAMA3_JSON`), or None
  when it renders no tools."""
  if not template:
    return None
  if "<tool_call>" in template:
    return HERMES
  if '"parameters"' in template and "tool_calls" in template:
    return LLAMA3_JSON
  return None


def _call(payload: Any, arguments_key: str) -> dict[str, Any] | None:
  """OpenAI's tool call of a parsed {"name", <arguments_key>} object, or None."""
  if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
    return None
  arguments = payload.get(arguments_key, {})
  return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
          "function": {"name": payload["name"], "arguments": json.dumps(arguments)}}


def parse_tool_calls(text: str, fmt: str | None) -> tuple[str | None, list[dict[str, Any]]]:
  """(content, tool_calls) of a sampled assistant text in format `fmt`: the text outside
  the calls (None when nothing is left) and OpenAI's tool calls ({id, type: "function",
  function: {name, arguments: a JSON string}}); ([text], []) when nothing parses."""
  if fmt == HERMES:
    blocks = list(_HERMES_CALL.finditer(text))
    calls = []
    for block in blocks:
      try:
        call = _call(json.loads(block.group(1)), "arguments")
      except ValueError:
        call = None
      if call is None:
        return text, []
      calls.append(call)
    if not calls:
      return text, []
    content = _HERMES_CALL.sub("", text).strip()
    return content or None, calls
  if fmt == LLAMA3_JSON:
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if body.startswith("{"):
      try:
        payload = json.loads(body)
      except ValueError:
        return text, []
      arguments_key = "parameters" if "parameters" in payload else "arguments"
      call = _call(payload, arguments_key)
      if call is not None:
        return None, [call]
  return text, []


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The messages as templates read them: OpenAI sends a call's `arguments` as a JSON
  string, and templates write them with `tojson` or iterate them, so a string holding a
  JSON object becomes that object (as vLLM does)."""
  ready = []
  for message in messages:
    calls = message.get("tool_calls")
    if isinstance(calls, list):
      message = {**message, "tool_calls": [_arguments_as_object(c) for c in calls]}
    ready.append(message)
  return ready


def _arguments_as_object(call: Any) -> Any:
  function = call.get("function") if isinstance(call, dict) else None
  if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
    return call
  try:
    arguments = json.loads(function["arguments"])
  except ValueError:
    return call
  if not isinstance(arguments, dict):
    return call
  return {**call, "function": {**function, "arguments": arguments}}
