"""The OpenAI-compatible HTTP face of the sampling server (needs the `serve` extra: aiohttp).

It runs beside gRPC in the same process, on its own thread and event loop, and drives
the same SamplerService (scheduler, weights, versions). Endpoints:

  GET  /v1/models
  POST /v1/completions            text or token ids (`prompt`, vLLM's `prompt_token_ids`)
  POST /v1/chat/completions       messages (and tools) rendered with the chat template,
                                  tool calls parsed back (serve/openai_tools.py)
  POST /tokenize, /detokenize     vLLM's shapes
  POST /inference/v1/generate     tokens in, tokens out ({token_ids, sampling_params})

`stream: true` answers server-sent events in OpenAI's chunk shapes, ended by
`data: [DONE]`. vLLM's `return_token_ids` adds `prompt_token_ids` to the response and
`token_ids` to each choice. Every response carries `policy_version` (the newest weights
version that sampled it) and `policy_versions` {first, last}.

When the server has a token every call needs `Authorization: Bearer <token>` (401
otherwise). More than `max_concurrent` calls at once answer 429; a body beyond
`max_body_bytes` 413; a bad field 400 naming it (serve/openai_wire.py). A client that
disconnects releases its request (its slots free at the next step).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import queue
import threading
from typing import Any

from aiohttp import web

from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from rlhf_jax.sampling.serve import openai_wire as ow
from rlhf_jax.sampling.serve import security as security_lib
from rlhf_jax.sampling.serve.loop import POLL_S
from rlhf_jax.sampling.serve.loop import SamplerService
from rlhf_jax.sampling.serve.openai_prompts import chat_prompt
from rlhf_jax.sampling.serve.openai_prompts import completion_prompt
from rlhf_jax.sampling.serve.openai_prompts import read_body
from rlhf_jax.sampling.serve.openai_prompts import tool_calls_format
from rlhf_jax.sampling.serve.security import ServerSecurity
from rlhf_jax.sampling.serve.wire import MAX_MESSAGE_BYTES

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
  return web.Response(text=json.dumps(body), status=status, content_type="application/json")


class OpenAIFace:
  """The aiohttp application over a SamplerService.

  Args:
    service: the running SamplerService (shared with gRPC).
    model_name: the id `/v1/models` lists; requests naming another model answer 404.
    security: the server's credentials; its token, when set, guards every endpoint.
    max_concurrent: most calls running at once (server.max_workers); more answer 429.
    max_body_bytes: the largest request body (larger: 413).
  """

  def __init__(self, service: SamplerService, *, model_name: str,
               security: ServerSecurity | None = None, max_concurrent: int = 16,
               max_body_bytes: int = MAX_MESSAGE_BYTES):
    self.service = service
    self.model_name = model_name
    security = security or ServerSecurity()
    self._expected = None if security.token is None else b"Bearer " + security.token
    self.max_concurrent = max_concurrent
    self.max_body_bytes = max_body_bytes
    self._running = 0
    # One thread per running call at most, each waiting on its request's event queue.
    self._waiters = concurrent.futures.ThreadPoolExecutor(max_concurrent,
                                                          thread_name_prefix="openai-http")
    for name in ("http_unauthenticated", "http_refused_busy", "http_errors"):
      service.counters.setdefault(name, 0)
    self.app = web.Application(client_max_size=max_body_bytes,
                               middlewares=[self._guard])
    self.app.add_routes([
        web.get("/v1/models", self.models),
        web.post("/v1/completions", self.completions),
        web.post("/v1/chat/completions", self.chat_completions),
        web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
        web.post("/inference/v1/generate", self.generate)])

  @web.middleware
  async def _guard(self, request: web.Request, handler):
    """Token, concurrency, and every refusal as OpenAI's error body."""
    counters = self.service.counters
    if self._expected is not None:
      sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
      if not hmac.compare_digest(sent, self._expected):
        counters["http_unauthenticated"] += 1
        return _json(ow.WireError(401, "missing or wrong API key (Authorization: Bearer "
                                  "<server.token_file>)", code="invalid_api_key").body(), 401)
    if self._running >= self.max_concurrent:
      counters["http_refused_busy"] += 1
      return _json(ow.WireError(429, f"{self.max_concurrent} calls already running "
                                "(server.max_workers)", kind="rate_limit_error",
                                code="server_busy").body(), 429)
    self._running += 1  # one event loop: no lock needed
    try:
      return await handler(request)
    except ow.WireError as error:
      return _json(error.body(), error.status)
    except web.HTTPException as error:  # unknown path, wrong method
      return _json(ow.WireError(error.status, error.reason, kind="not_found_error"
                                if error.status == 404 else "invalid_request_error").body(),
                   error.status)
    except Exception as error:  # nothing a client sends stops the server
      counters["http_errors"] += 1
      logging.exception("HTTP %s %s failed", request.method, request.path)
      return _json(ow.WireError(500, f"internal error: {error!r}", kind="server_error")
                   .body(), 500)
    finally:
      self._running -= 1

  async def _body(self, request: web.Request, allowed: frozenset[str]) -> dict[str, Any]:
    body = ow.check_fields(await read_body(request, self.max_body_bytes), allowed)
    model = body.get("model")
    if model is not None and model != self.model_name:
      raise ow.WireError(404, f"model: {model!r} is not served here (GET /v1/models: "
                         f"{self.model_name!r})", "model", code="model_not_found")
    return body

  async def _off_loop(self, fn, *args):
    """`fn(*args)` on a worker thread: templates and tokenizers must not hold the loop."""
    return await asyncio.get_running_loop().run_in_executor(self._waiters, fn, *args)

  def _submit(self, prompt_ids: list[int], sampling) -> tuple[str, queue.Queue]:
    counters = self.service.counters
    try:
      return self.service.submit(prompt_ids, sampling)
    except QueueFull as error:
      counters["requests_rejected"] += 1
      raise ow.WireError(429, str(error), kind="rate_limit_error",
                         code="queue_full") from None
    except ValueError as error:  # RequestTooLarge too: both name their field
      counters["requests_invalid"] += 1
      message = str(error).replace("max_new_tokens", "max_tokens")
      raise ow.WireError(400, message, message.split("=")[0].split(" ")[0]) from None

  async def _events(self, request: web.Request, events: queue.Queue, samples: int):
    """Yields batches of a request's events until its samples are done; stops when the
    client has gone (the caller releases the request)."""
    done = 0
    while done < samples:
      try:
        batch = [await self._off_loop(events.get, True, POLL_S)]
      except queue.Empty:
        if request.transport is None or request.transport.is_closing():
          return
        continue
      while True:
        try:
          batch.append(events.get_nowait())
        except queue.Empty:
          break
      for event in batch:
        if event[0] == "failed":
          raise ow.WireError(500, event[1], kind="server_error")
        if event[0] == "done":
          done += 1
          if event[1].finish_reason == "error":
            raise ow.WireError(500, event[1].error, kind="server_error")
      yield batch

  async def _run(self, request, prompt_ids, sampling, kind, shape, *, chat: bool,
                 body: dict[str, Any]) -> web.StreamResponse:
    """Samples, and answers the whole response or (stream=true) its chunks."""
    request_id, events = self._submit(prompt_ids, sampling)
    try:
      if body.get("stream"):
        return await self._stream(request, request_id, events, prompt_ids, sampling, kind,
                                  shape, chat=chat, body=body)
      finished = [None] * sampling.n
      async for batch in self._events(request, events, sampling.n):
        for event in batch:
          if event[0] == "done":
            finished[event[1].sample_index] = event[1]
      if any(c is None for c in finished):
        raise ow.WireError(499, "the client went away", kind="cancelled")
      response = {**ow.envelope(kind, request_id, self.model_name),
                  "choices": [shape(c, body) for c in finished],
                  "usage": ow.usage(len(prompt_ids), finished), **ow.versions(finished)}
      if body.get("return_token_ids"):
        response["prompt_token_ids"] = list(prompt_ids)
      return _json(response)
    finally:
      self.service.release(request_id)

  async def _stream(self, request, request_id, events, prompt_ids, sampling, kind, shape,
                    *, chat: bool, body: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers=_SSE_HEADERS)
    await response.prepare(request)
    chunk_kind = "chat.completion.chunk" if chat else kind
    head = ow.envelope(chunk_kind, request_id, self.model_name)
    texts = [ow.TextDeltas(self.service.tokenizer) for _ in range(sampling.n)]
    finished = []

    async def send(payload):
      await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    try:
      if chat:  # OpenAI opens each choice with the assistant's role
        await send({**head, "choices": [{"index": i, "delta": {"role": "assistant",
                                                               "content": ""},
                                         "logprobs": None, "finish_reason": None}
                                        for i in range(sampling.n)],
                    **({"prompt_token_ids": list(prompt_ids)}
                       if body.get("return_token_ids") else {})})
      async for batch in self._events(request, events, sampling.n):
        new = {}  # per sample, its new (token, model log-prob) pairs
        for event in batch:
          if event[0] == "token":
            new.setdefault(event[1], []).append((event[2], event[4]))
        choices = []
        for index, pairs in sorted(new.items()):
          ids, logprobs = [p[0] for p in pairs], [p[1] for p in pairs]
          choices.append(shape.chunk(index, texts[index].add(ids), ids, logprobs, body))
        if choices:
          await send({**head, "choices": choices})
        for event in batch:
          if event[0] == "done":
            finished.append(event[1])
            rest = texts[event[1].sample_index].rest()
            if rest:
              await send({**head, "choices": [shape.chunk(event[1].sample_index, rest, [],
                                                          [], body)]})
            await send({**head, "choices": [shape.finish(event[1], body)],
                        **ow.versions([event[1]])})
      if len(finished) == sampling.n:
        if (body.get("stream_options") or {}).get("include_usage"):
          await send({**head, "choices": [], "usage": ow.usage(len(prompt_ids), finished)})
        await response.write(b"data: [DONE]\n\n")
    except ow.WireError as error:  # after the headers: the error is the last event
      await send(error.body())
    except ConnectionResetError:
      pass  # the client went away; the caller releases the request
    return response

  async def models(self, request: web.Request) -> web.Response:
    """GET /v1/models: the one served model."""
    del request
    scheduler = self.service.scheduler
    return _json({"object": "list", "data": [{
        "id": self.model_name, "object": "model", "created": 0, "owned_by": "rlhf_jax",
        "max_model_len": scheduler.engine.cache_length,
        "policy_version": scheduler.weights_version}]})

  async def completions(self, request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    body = await self._body(request, ow.COMPLETION_FIELDS)
    prompt_ids = await self._off_loop(completion_prompt, self.service, body)
    sampling = self._sampling(body, prompt_ids, chat=False)
    return await self._run(request, prompt_ids, sampling, "text_completion",
                           ow.CompletionShape(self.service.tokenizer), chat=False, body=body)

  async def chat_completions(self, request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    body = await self._body(request, ow.CHAT_FIELDS)
    prompt_ids = await self._off_loop(chat_prompt, self.service, body)
    sampling = self._sampling(body, prompt_ids, chat=True)
    tools = tool_calls_format(self.service.tokenizer, body)
    return await self._run(request, prompt_ids, sampling, "chat.completion",
                           ow.ChatShape(self.service.tokenizer, tools), chat=True,
                           body=body)

  def _sampling(self, body, prompt_ids, *, chat: bool):
    most = self.service.max_samples_per_request
    if isinstance(body.get("n"), int) and body["n"] > most:
      self.service.counters["requests_over_limit"] += 1
      raise ow.bad("n", f"{body['n']} is more than this server's {most} samples per "
                   "request (server.max_samples_per_request)")
    return ow.sampling_params(body, chat=chat, prompt_length=len(prompt_ids),
                              cache_length=self.service.scheduler.engine.cache_length,
                              tokenizer=self.service.tokenizer)

  async def generate(self, request: web.Request) -> web.Response:
    """POST /inference/v1/generate: {token_ids, sampling_params} → choices[].token_ids,
    per-token log-probs, finish_reason (no text, no template)."""
    body = await self._body(request, frozenset(("model", "token_ids", "sampling_params",
                                                "request_id")))
    prompt_ids = ow.token_ids(body.get("token_ids"), "token_ids")
    options = body.get("sampling_params") or {}
    ow.check_fields(options, ow.COMPLETION_FIELDS - {"prompt", "prompt_token_ids", "echo",
                                                     "suffix", "stream", "model"})
    sampling = self._sampling(options, prompt_ids, chat=False)
    options = {**options, "return_token_ids": True}
    return await self._run(request, prompt_ids, sampling, "generate",
                           ow.GenerateShape(), chat=False, body=options)

  async def tokenize(self, request: web.Request) -> web.Response:
    """POST /tokenize (vLLM): {prompt} or {messages} → {count, max_model_len, tokens}."""
    allowed = frozenset(("model", "prompt", "messages", "add_generation_prompt",
                         "add_special_tokens", "chat_template_kwargs"))
    body = await self._body(request, allowed)
    if "messages" in body:
      ids = await self._off_loop(chat_prompt, self.service, body)
    elif not isinstance(body.get("prompt"), str):
      raise ow.bad("prompt", "must be a string (or send messages)")
    else:
      ids = await self._off_loop(completion_prompt, self.service, body)
    return _json({"count": len(ids), "tokens": ids,
                  "max_model_len": self.service.scheduler.engine.cache_length})

  async def detokenize(self, request: web.Request) -> web.Response:
    """POST /detokenize (vLLM): {tokens} → {prompt}."""
    body = await self._body(request, frozenset(("model", "tokens")))
    ids = ow.token_ids(body.get("tokens"), "tokens")
    if self.service.tokenizer is None:
      raise ow.bad("tokens", "this server has no tokenizer (config tokenizer=...)")
    if max(ids) >= self.service.tokenizer.vocab_size:
      raise ow.bad("tokens", f"has ids outside the tokenizer's vocabulary (size "
                   f"{self.service.tokenizer.vocab_size})")
    return _json({"prompt": await self._off_loop(self.service.detokenize, ids)})


class HttpServer:
  """An OpenAIFace served on host:port from a thread of its own; `stop()` ends it.

  Attributes:
    port: the bound port; url: `http://host:port/v1`, what an OpenAI client's base_url
      takes.
  """

  def __init__(self, face: OpenAIFace, host: str, port: int, ssl_context=None):
    self.face = face
    self._loop = asyncio.new_event_loop()
    self._runner = web.AppRunner(face.app, access_log=None, handle_signals=False,
                                 shutdown_timeout=1)
    started: concurrent.futures.Future = concurrent.futures.Future()
    self._thread = threading.Thread(target=self._serve, args=(host, port, ssl_context,
                                                              started),
                                    name="openai-http", daemon=True)
    self._thread.start()
    self.port = started.result(timeout=60)  # re-raises a bind failure (OSError)
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if ssl_context is not None else "http"
    self.url = f"{scheme}://{shown}:{self.port}/v1"

  def _serve(self, host: str, port: int, ssl_context,
             started: concurrent.futures.Future) -> None:
    asyncio.set_event_loop(self._loop)
    try:
      self._loop.run_until_complete(self._runner.setup())
      site = web.TCPSite(self._runner, host, port, reuse_address=False,
                         ssl_context=ssl_context)
      self._loop.run_until_complete(site.start())
      bound = self._runner.addresses[0][1]
    except BaseException as error:  # pylint: disable=broad-except
      started.set_exception(error if isinstance(error, OSError) else OSError(str(error)))
      return
    started.set_result(bound)
    self._loop.run_forever()
    self._loop.run_until_complete(self._runner.cleanup())
    self._loop.close()

  def stop(self) -> None:
    """Closes the listening socket and open connections; waits for the thread."""
    if self._loop.is_running():
      self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=30)
    self.face._waiters.shutdown(wait=False, cancel_futures=True)


def start_http(service: SamplerService, *, host: str = "localhost", port: int = 0,
               model_name: str = "rlhf_jax", security: ServerSecurity | None = None,
               max_concurrent: int = 16, max_body_bytes: int = MAX_MESSAGE_BYTES,
               ssl_context=None) -> HttpServer:
  """Serves the OpenAI face of `service` on host:port (0: any free port); HTTPS with
  `ssl_context` (an ssl.SSLContext).

  Raises:
    ValueError: a host beyond loopback without a credential (the gRPC server's rule).
    OSError: nothing can listen on host:port.
  """
  security = security or ServerSecurity()
  if not security_lib.is_loopback(host) and not security.has_credential:
    raise ValueError(f"host={host!r} is not loopback: the HTTP face listens beyond "
                     "loopback only with a token (server.token_file) or client "
                     "certificates (server.tls_ca).")
  return HttpServer(OpenAIFace(service, model_name=model_name, security=security,
                               max_concurrent=max_concurrent,
                               max_body_bytes=max_body_bytes), host, port, ssl_context)
