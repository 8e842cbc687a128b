"""OpenAI's (and vLLM's) request fields ⇄ SamplingParams, and the response bodies.

No HTTP here (serve/openai_http.py serves these): a request body (a parsed JSON object) is
checked field by field and turned into SamplingParams; a finished sample becomes a
choice of OpenAI's shapes. Every refusal is a `WireError` naming the field, answered with
OpenAI's error body {"error": {"message", "type", "param", "code"}}.

Fields we do not serve are refused, never ignored: an unknown field, a `top_logprobs`
(the engine reports the log-probability of the sampled token only), a penalty other than
0, a forced tool_choice. Log-probabilities are the model's at temperature 1 (vLLM's raw
log-probs; PPO's π_old), `Completion.model_logprobs`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.serve.config import MAX_TEMPERATURE
from rlhf_jax.sampling.serve.openai_tools import parse_tool_calls

# Completions default to 16 new tokens, as OpenAI's and vLLM's do; chat to the room left.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# Special tokens that end an assistant turn in the template families we ship (ChatML /
# Qwen, Llama 3): a chat completion stops at these besides the tokenizer's EOS.
TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>")
MAX_STOP_STRINGS = 16
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}
_SAMPLING_FIELDS = ("model", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                    "stop", "stop_token_ids", "seed", "stream", "stream_options", "user",
                    "return_token_ids", "ignore_eos", "frequency_penalty",
                    "presence_penalty", "logprobs")
CHAT_FIELDS = frozenset(_SAMPLING_FIELDS + (
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
    "chat_template_kwargs", "tools", "tool_choice"))
COMPLETION_FIELDS = frozenset(_SAMPLING_FIELDS + ("prompt", "prompt_token_ids", "echo",
                                                  "best_of", "suffix"))


class WireError(Exception):
  """A refused request: HTTP status, one-line message, the field it names (OpenAI's
  `param`), OpenAI's error `type` and `code`."""

  def __init__(self, status: int, message: str, param: str | None = None, *,
               kind: str = "invalid_request_error", code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.param, self.kind, self.code = (
        status, message, param, kind, code)

  def body(self) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


def bad(field: str, message: str) -> WireError:
  """A 400 naming `field`: `<field>: <message>`."""
  return WireError(400, f"{field}: {message}", field)


def check_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
  """`body` as a dict whose keys are all in `allowed`; WireError naming the first other."""
  if not isinstance(body, dict):
    raise WireError(400, f"the request body must be a JSON object; got "
                    f"{type(body).__name__}")
  unknown = sorted(set(body) - allowed)
  if unknown:
    raise bad(unknown[0], "is not a field this server takes")
  return body


def _int(body, field, *, low: int, default=None) -> int | None:
  value = body.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise bad(field, f"must be an integer >= {low}; got {value!r}")
  return value


def _number(body, field, default: float) -> float:
  value = body.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
      value):
    raise bad(field, f"must be a finite number; got {value!r}")
  return float(value)


def _bool(body, field) -> bool:
  """The JSON boolean `field` (absent or null: false)."""
  value = body.get(field)
  if value is not None and not isinstance(value, bool):
    raise bad(field, f"must be true or false; got {value!r}")
  return bool(value)


def token_ids(value: Any, field: str) -> list[int]:
  """`value` as a non-empty list of non-negative ints; WireError naming `field`."""
  if (not isinstance(value, list) or not value or not all(
      isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
    raise bad(field, "must be a non-empty list of non-negative token ids")
  return value


def _stop_ids(body, tokenizer) -> list[int]:
  """Token ids of `stop` (a string or up to MAX_STOP_STRINGS) and `stop_token_ids`: each
  stop string must be one token (the engine stops on tokens, not text)."""
  stop = body.get("stop")
  strings = [] if stop is None else [stop] if isinstance(stop, str) else stop
  if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
    raise bad("stop", "must be a non-empty string or a list of them")
  if len(strings) > MAX_STOP_STRINGS:
    raise bad("stop", f"has {len(strings)} strings; at most {MAX_STOP_STRINGS}")
  ids = []
  for text in strings:
    encoded = [] if tokenizer is None else tokenizer.encode(text)
    if len(encoded) != 1:
      raise bad("stop", f"{text!r} is {len(encoded)} tokens; this server stops on single "
                "tokens only (or send stop_token_ids)")
    ids.append(encoded[0])
  if body.get("stop_token_ids") is not None:
    ids += token_ids(body["stop_token_ids"], "stop_token_ids")
  return ids


def default_stop_ids(tokenizer, *, chat: bool) -> list[int]:
  """The tokenizer's EOS and, for chat, the turn-end tokens it has (TURN_END_TOKENS)."""
  if tokenizer is None:
    return []
  ids = [tokenizer.eos_id]
  if chat:
    ids += [t for t in (tokenizer.backend.token_to_id(name) for name in TURN_END_TOKENS)
            if t is not None]
  return ids


def sampling_params(body: dict[str, Any], *, chat: bool, prompt_length: int,
                    cache_length: int, tokenizer) -> SamplingParams:
  """The SamplingParams of a checked request body; WireError naming the field."""
  for field in ("stream", "return_token_ids"):
    _bool(body, field)
  options = body.get("stream_options") or {}
  if not isinstance(options, dict) or set(options) - {"include_usage"}:
    raise bad("stream_options", "must be an object ({'include_usage': true})")
  _bool(options, "include_usage")
  for field in ("frequency_penalty", "presence_penalty"):
    if _number(body, field, 0.0) != 0.0:
      raise bad(field, "is not served (only 0)")
  room = cache_length - prompt_length
  if room < 1:
    raise bad("messages" if chat else "prompt", f"has {prompt_length} tokens; this "
              f"server's context holds {cache_length}")
  max_tokens = _int(body, "max_tokens", low=1)
  if chat:
    limit = _int(body, "max_completion_tokens", low=1)
    max_tokens = limit if limit is not None else max_tokens
    _bool(body, "logprobs")
    if _int(body, "top_logprobs", low=0, default=0):
      raise bad("top_logprobs", "is not served: the engine reports the sampled token's "
                "log-probability only (send logprobs=true)")
  elif _int(body, "logprobs", low=0, default=0):
    raise bad("logprobs", "must be 0 or absent: the engine reports the sampled token's "
              "log-probability only (0 returns it)")
  default = room if chat else min(room, COMPLETIONS_DEFAULT_MAX_TOKENS)
  max_tokens = default if max_tokens is None else max_tokens
  if max_tokens > room:
    raise bad("max_completion_tokens" if chat and body.get("max_completion_tokens")
              else "max_tokens", f"{max_tokens} does not fit: the prompt has "
              f"{prompt_length} tokens and the context holds {cache_length}")
  stop = _stop_ids(body, tokenizer)
  if not _bool(body, "ignore_eos"):
    stop += default_stop_ids(tokenizer, chat=chat)
  temperature = _number(body, "temperature", 1.0)
  if temperature > MAX_TEMPERATURE:  # beyond float32's range it becomes inf: NaN logits
    raise bad("temperature", f"{temperature} is above {MAX_TEMPERATURE}")
  top_p = _number(body, "top_p", 1.0)
  min_p = _number(body, "min_p", 0.0)
  top_k = body.get("top_k")
  top_k = 0 if top_k in (None, -1) else _int(body, "top_k", low=0)  # vLLM: -1 = off
  seed = _int(body, "seed", low=0)
  try:
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
        max_new_tokens=max_tokens, n=_int(body, "n", low=1, default=1),
        stop_token_ids=tuple(dict.fromkeys(stop)))
  except ValueError as error:  # SamplingParams names its own field
    message = str(error)
    raise WireError(400, message, message.split("=")[0].split(" ")[0]) from None


def versions(completions: list[Completion]) -> dict[str, Any]:
  """The policy versions that sampled `completions`: `policy_version` (the newest) and
  `policy_versions` {first, last} (they differ when the weights were swapped mid-sample
  or between samples)."""
  first = min(c.weights_version[0] for c in completions)
  last = max(c.weights_version[1] for c in completions)
  return {"policy_version": last, "policy_versions": {"first": first, "last": last}}


def usage(prompt_length: int, completions: list[Completion]) -> dict[str, int]:
  """OpenAI's usage block."""
  generated = sum(len(c.token_ids) for c in completions)
  return {"prompt_tokens": prompt_length, "completion_tokens": generated,
          "total_tokens": prompt_length + generated}


def finish_reason(completion: Completion) -> str:
  """OpenAI's finish_reason of a sample ("abort" for a cancelled one, as vLLM's)."""
  return FINISH_REASONS[completion.finish_reason]


def token_logprobs(tokenizer, ids: list[int], logprobs: list[float], *, chat: bool):
  """The logprobs block of a choice: chat's {"content": [{token, logprob, bytes,
  top_logprobs}]}, or completions' {tokens, token_logprobs, top_logprobs, text_offset}."""
  pieces = [tokenizer.decode([t], skip_special_tokens=False) if tokenizer else str(t)
            for t in ids]
  if chat:
    return {"content": [{"token": piece, "logprob": float(lp),
                         "bytes": list(piece.encode("utf-8")), "top_logprobs": []}
                        for piece, lp in zip(pieces, logprobs)]}
  offsets, at = [], 0
  for piece in pieces:
    offsets.append(at)
    at += len(piece)
  return {"tokens": pieces, "token_logprobs": [float(lp) for lp in logprobs],
          "top_logprobs": None, "text_offset": offsets}


class TextDeltas:
  """A sample's text, streamed: `add(ids)` returns the text the new ids add, decoding only
  the ids since the last emitted piece (vLLM's prefix/read offsets) so a long stream costs
  O(length), and holding back a piece that ends in a partial UTF-8 character ("\ufffd")
  until its bytes are complete. The deltas join to `tokenizer.decode` of all the ids."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.ids: list[int] = []
    self._prefix = 0  # ids[_prefix:_read] decode to text already emitted: the context
    self._read = 0

  def add(self, ids) -> str:
    """The text `ids` add (maybe "" while a character is incomplete)."""
    self.ids.extend(ids)
    if self.tokenizer is None:
      return ""
    emitted = self.tokenizer.decode(self.ids[self._prefix:self._read])
    text = self.tokenizer.decode(self.ids[self._prefix:])
    if len(text) <= len(emitted) or text.endswith("\ufffd"):
      return ""
    self._prefix, self._read = self._read, len(self.ids)
    return text[len(emitted):]

  def rest(self) -> str:
    """The text held back, once the sample is over (an incomplete character included)."""
    if self.tokenizer is None or self._read == len(self.ids):
      return ""
    emitted = self.tokenizer.decode(self.ids[self._prefix:self._read])
    self._read = len(self.ids)
    return self.tokenizer.decode(self.ids[self._prefix:])[len(emitted):]


ID_PREFIXES = {"text_completion": "cmpl", "chat.completion": "chatcmpl",
               "chat.completion.chunk": "chatcmpl", "generate": "gen"}


def envelope(kind: str, request_id: str, model: str) -> dict[str, Any]:
  """The fields every response or chunk opens with (its id: the sampler's request id
  behind OpenAI's prefix)."""
  return {"id": f"{ID_PREFIXES[kind]}-{request_id}", "object": kind, "created": int(time.time()), "model": model}


class CompletionShape:
  """The choices of /v1/completions: whole (`__call__`), streamed (`chunk`, `finish`)."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def _text(self, ids) -> str:
    return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

  def _extras(self, ids, logprobs, body, *, chat: bool) -> dict[str, Any]:
    extras = {"logprobs": None}
    wanted = body.get("logprobs") if chat else body.get("logprobs") is not None
    if wanted:
      extras["logprobs"] = token_logprobs(self.tokenizer, ids, logprobs, chat=chat)
    if body.get("return_token_ids"):
      extras["token_ids"] = list(ids)
    return extras

  def __call__(self, completion: Completion, body) -> dict[str, Any]:
    """A finished sample as a choice."""
    return {"index": completion.sample_index, "text": self._text(completion.token_ids),
            **self._extras(completion.token_ids, completion.model_logprobs, body,
                           chat=False),
            "finish_reason": finish_reason(completion), **versions([completion])}

  def chunk(self, index: int, text: str, ids, logprobs, body) -> dict[str, Any]:
    """The new text (and ids, log-probs) of sample `index`."""
    return {"index": index, "text": text, **self._extras(ids, logprobs, body, chat=False),
            "finish_reason": None}

  def finish(self, completion: Completion, body) -> dict[str, Any]:
    """The last chunk of a sample: its finish_reason and versions."""
    del body
    return {"index": completion.sample_index, "text": "", "logprobs": None,
            "finish_reason": finish_reason(completion), **versions([completion])}


class ChatShape(CompletionShape):
  """The choices of /v1/chat/completions (`message`, streamed `delta`). With a
  `tool_format` (openai_tools) the calls in a sample's text become `tool_calls` (and its
  finish_reason "tool_calls"); a stream then sends a sample's text and calls whole in its
  last chunk, since a call is known only once it is closed."""

  def __init__(self, tokenizer, tool_format: str | None = None):
    super().__init__(tokenizer)
    self.tool_format = tool_format

  def _message(self, completion: Completion) -> tuple[dict[str, Any], str]:
    text = self._text(completion.token_ids)
    reason = finish_reason(completion)
    if self.tool_format is None:
      return {"content": text}, reason
    content, calls = parse_tool_calls(text, self.tool_format)
    if not calls:
      return {"content": text}, reason
    return {"content": content, "tool_calls": calls}, (
        "tool_calls" if reason == "stop" else reason)

  def __call__(self, completion: Completion, body) -> dict[str, Any]:
    """A finished sample as a choice."""
    message, reason = self._message(completion)
    return {"index": completion.sample_index, "message": {"role": "assistant", **message},
            **self._extras(completion.token_ids, completion.model_logprobs, body,
                           chat=True),
            "finish_reason": reason, **versions([completion])}

  def chunk(self, index: int, text: str, ids, logprobs, body) -> dict[str, Any]:
    """The new text (and ids, log-probs) of sample `index`."""
    delta = {} if self.tool_format else {"content": text}
    return {"index": index, "delta": delta, **self._extras(ids, logprobs, body, chat=True),
            "finish_reason": None}

  def finish(self, completion: Completion, body) -> dict[str, Any]:
    """The last chunk of a sample: its finish_reason and versions (and, with tools, its
    text and calls)."""
    del body
    delta, reason = {}, finish_reason(completion)
    if self.tool_format:
      message, reason = self._message(completion)
      delta = dict(message)
      if "tool_calls" in message:  # a stream's calls carry their index
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    return {"index": completion.sample_index, "delta": delta, "logprobs": None,
            "finish_reason": reason, **versions([completion])}


class GenerateShape:
  """The choices of /inference/v1/generate: token ids, their log-probs as vLLM spells
  tokens given as ids ("token_id:<id>"), finish_reason."""

  def __call__(self, completion: Completion, body) -> dict[str, Any]:
    """A finished sample as a choice."""
    del body
    return {"index": completion.sample_index, "token_ids": list(completion.token_ids),
            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": float(lp)}
                                     for t, lp in zip(completion.token_ids,
                                                      completion.model_logprobs)]},
            "finish_reason": finish_reason(completion), **versions([completion])}
