"""The OpenAI-compatible HTTP face, driven by the official `openai` client (and raw HTTP
for what the client cannot send): its samples are the gRPC path's for the same prompt
ids and seed, its prompt ids the tokenizer's encoding of the rendered chat, plus
streaming, auth, errors, vLLM's extensions and a client that goes away."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models.tokenizer import CHATML_JINJA
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import config as serve_config_lib
from rlhf_jax.sampling.serve import openai_http
from rlhf_jax.sampling.serve import server as server_lib
from rlhf_jax.sampling.serve.loop import SamplerService
from rlhf_jax.sampling.serve.security import ServerSecurity
from tests.fakes import ALPHABET
from tests.fakes import fake_tokenizer
from tests.sampling.holds import Hold
from tests.sampling.holds import cancel_arrived
from tests.sampling.serve_configs import serve_config

openai = pytest.importorskip("openai")

TOKEN = "s3cret-token"
TOKENIZER = fake_tokenizer(ALPHABET + '<>/_{}":,')
# Hermes' tool format in few characters (the published templates' round trip is in
# test_openai_tools.py): the template the tokenizer renders when a request has tools.
TOKENIZER.chat_templates["default"] = CHATML_JINJA
TOKENIZER.chat_templates["tool_use"] = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor %}{%- if tools %}<|im_start|>system\n{%- for t in tools %}<t>"
    "{{ t.function.name }}</t>{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    "{#- a call: <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> #}")
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CONFIG = models.DecoderConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1,
                              num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2=?"}]
MAX_SAMPLES = 4
HTTP = httpx.Client(timeout=60)  # one client: a new one builds an SSL context (~20 ms)
MAX_BODY = 1 << 16


@pytest.fixture(scope="module")
def served():
  model, params = models.init_model(CONFIG, seed=0)
  engine = sampling.Engine(model, num_slots=4, cache_length=64)
  security = ServerSecurity(token=TOKEN.encode())
  scheduler = Scheduler(engine, params, prompt_buckets=(16, 32, 48), steps_per_sync=2)
  server, port, service = server_lib.start_server(
      scheduler, port=0, tokenizer=TOKENIZER, security=security,
      max_samples_per_request=MAX_SAMPLES)
  http = openai_http.start_http(service, model_name="tiny", security=security,
                                max_body_bytes=MAX_BODY)
  grpc_client = SamplerClient(f"localhost:{port}", timeout_s=60)
  client = openai.OpenAI(base_url=http.url, api_key=TOKEN, max_retries=0, timeout=60)
  yield client, grpc_client, service, http
  http.stop()
  grpc_client.close()
  server.stop(grace=None)
  service.stop()


def raw(http, path, body, *, token=TOKEN, method="POST"):
  """(status, JSON) of one call; body bytes are sent as they are."""
  headers = {"Authorization": f"Bearer {token}"} if token else {}
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  url = http.url.removesuffix("/v1") + path
  reply = HTTP.request(method, url, content=None if method == "GET" else data,
                      headers=headers)
  return reply.status_code, reply.json()


def grpc_samples(grpc_client, prompt_ids, *, chat, **fields):
  """The gRPC path's samples for the same ids: the server's stop tokens, as documented."""
  stop = [TOKENIZER.eos_id] + ([TOKENIZER.backend.token_to_id("<|im_end|>")] if chat else [])
  return grpc_client.generate_one(prompt_ids, sampling.SamplingParams(
      stop_token_ids=stop, **fields))


def test_models_lists_the_served_model(served):
  client, _, _, _ = served
  assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_prompt_ids_are_the_rendered_template_and_samples_the_grpc_paths(served):
  client, grpc_client, _, _ = served
  reply = client.chat.completions.create(
      model="tiny", messages=MESSAGES, max_tokens=12, n=2, seed=7, temperature=0.8,
      logprobs=True, extra_body={"return_token_ids": True, "top_k": 20})
  extra = reply.model_extra
  rendered = TOKENIZER.apply_chat_template(MESSAGES, add_generation_prompt=True)
  assert extra["prompt_token_ids"] == TOKENIZER.encode(rendered)
  expected = grpc_samples(grpc_client, extra["prompt_token_ids"], chat=True, n=2, seed=7,
                          temperature=0.8, top_k=20, max_new_tokens=12)
  for choice, sample in zip(reply.choices, expected):
    ids = choice.model_extra["token_ids"]
    assert ids == sample.token_ids
    assert choice.message.content == TOKENIZER.decode(ids)
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(
        sample.model_logprobs, abs=1e-5)
    assert choice.finish_reason == sample.finish_reason  # "stop" or "length" alike
  assert reply.usage.prompt_tokens == len(extra["prompt_token_ids"])
  served_version = grpc_client.health().weights_version
  assert extra["policy_version"] == served_version
  assert extra["policy_versions"] == {"first": served_version, "last": served_version}


def test_completions_take_text_and_token_ids(served):
  client, grpc_client, _, http = served
  ids = TOKENIZER.encode("7*6=")
  by_text = client.completions.create(model="tiny", prompt="7*6=", max_tokens=6, seed=3,
                                      extra_body={"return_token_ids": True})
  by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, seed=3,
                                     extra_body={"return_token_ids": True})
  expected = grpc_samples(grpc_client, ids, chat=False, seed=3, max_new_tokens=6)[0]
  for reply in (by_text, by_ids):
    assert reply.model_extra["prompt_token_ids"] == ids
    assert reply.choices[0].model_extra["token_ids"] == expected.token_ids
    assert reply.choices[0].text == TOKENIZER.decode(expected.token_ids)
  status, body = raw(http, "/v1/completions", {"prompt_token_ids": ids, "max_tokens": 6,
                                               "seed": 3, "logprobs": 0})
  assert status == 200 and body["choices"][0]["text"] == by_ids.choices[0].text
  assert body["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
      expected.model_logprobs, abs=1e-5)


def test_streams_carry_what_the_whole_response_does(served):
  client, _, _, _ = served
  fields = dict(model="tiny", max_tokens=10, seed=5, extra_body={"return_token_ids": True})
  whole = client.chat.completions.create(messages=MESSAGES, **fields)
  chunks = list(client.chat.completions.create(messages=MESSAGES, stream=True,
                                               stream_options={"include_usage": True},
                                               **fields))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert chunks[0].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
      whole.choices[0].message.content)
  assert sum((c.choices[0].model_extra.get("token_ids", []) for c in chunks if c.choices),
             []) == whole.choices[0].model_extra["token_ids"]
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == (
      whole.choices[0].finish_reason)
  assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
  text = client.completions.create(prompt="1+1=", max_tokens=5, seed=2, model="tiny")
  pieces = list(client.completions.create(prompt="1+1=", max_tokens=5, seed=2, model="tiny",
                                          stream=True))
  assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text


def test_tools_are_rendered_through_the_template(served):
  client, _, _, _ = served
  messages = [{"role": "user", "content": "1+1"}]
  reply = client.chat.completions.create(model="tiny", messages=messages, tools=[TOOL],
                                         max_tokens=4, extra_body={"return_token_ids": True})
  rendered = TOKENIZER.apply_chat_template(messages, tools=[TOOL])
  assert "<t>f</t>" in rendered  # the tool_use template, with the tool
  assert reply.model_extra["prompt_token_ids"] == TOKENIZER.encode(rendered)
  assert reply.choices[0].message.content == TOKENIZER.decode(
      reply.choices[0].model_extra["token_ids"])  # no call in a random model's text
  with pytest.raises(openai.BadRequestError, match="tool_choice"):
    client.chat.completions.create(model="tiny", messages=messages, tools=[TOOL],
                                   tool_choice="required")


def test_tokenize_detokenize_and_generate(served):
  _, grpc_client, _, http = served
  status, body = raw(http, "/tokenize", {"prompt": "12 + 30"})
  assert status == 200 and body["tokens"] == TOKENIZER.encode("12 + 30")
  assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 64
  status, chat = raw(http, "/tokenize", {"messages": MESSAGES})
  assert chat["tokens"] == TOKENIZER.encode(TOKENIZER.apply_chat_template(MESSAGES))
  status, body = raw(http, "/detokenize", {"tokens": body["tokens"]})
  assert status == 200 and body["prompt"] == "12 + 30"
  ids = TOKENIZER.encode("abc")
  status, body = raw(http, "/inference/v1/generate", {
      "token_ids": ids, "sampling_params": {"max_tokens": 5, "seed": 9, "n": 2}})
  expected = grpc_samples(grpc_client, ids, chat=False, seed=9, n=2, max_new_tokens=5)
  assert status == 200 and body["policy_version"] == 0
  assert [c["token_ids"] for c in body["choices"]] == [s.token_ids for s in expected]
  assert [lp["logprob"] for lp in body["choices"][0]["logprobs"]["content"]] == (
      pytest.approx(expected[0].model_logprobs, abs=1e-5))


def test_a_key_is_needed_and_checked(served):
  _, _, service, http = served
  with pytest.raises(openai.AuthenticationError):
    openai.OpenAI(base_url=http.url, api_key="wrong", max_retries=0).models.list()
  status, body = raw(http, "/v1/models", b"", token=None, method="GET")
  assert status == 401 and body["error"]["code"] == "invalid_api_key"
  undecodable = httpx.get(http.url + "/models", headers=[(b"Authorization", b"Bearer \xff")])
  assert undecodable.status_code == 401
  assert service.counters["http_unauthenticated"] == 3


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    ({"messages": MESSAGES, "bogus": 1}, 400, "bogus"),
    ({"messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": MESSAGES, "n": MAX_SAMPLES + 1}, 400, "n"),
    ({"messages": MESSAGES, "max_tokens": 1000}, 400, "max_tokens"),
    ({"messages": MESSAGES, "stop": "ab"}, 400, "stop"),
    ({"messages": [{"content": "no role"}]}, 400, "messages[0]"),
    ({"messages": MESSAGES, "model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "x" * MAX_BODY}]}, 413, None),
])
def test_refusals_are_openai_error_bodies_naming_the_field(served, body, status, param):
  _, _, _, http = served
  got, reply = raw(http, "/v1/chat/completions", body)
  assert got == status
  assert set(reply["error"]) == {"message", "type", "param", "code"}
  assert reply["error"]["param"] == param
  if param:
    assert reply["error"]["message"].startswith(param)


HOSTILE = [b"", b"null", b"[]", b"1e999", b"[" * 5000 + b"]" * 5000, b'{"prompt": NaN}',
           {"messages": [{"role": "user", "content": {"a": 1}}]}, {"messages": "hi"},
           {"prompt": [10**30]}, {"prompt": [999]}, {"prompt": 5}, {"prompt": "\ud800"},
           {"prompt": "\u03a9"}, {"prompt": "a", "n": 10**20}, {"prompt": "a", "seed": 2**40},
           {"prompt": "a", "max_tokens": 10**20}, {"prompt": "a", "temperature": 1e300},
           {"prompt": "a", "top_k": 10**9}, {"prompt": "a", "stop_token_ids": [10**9]},
           {"prompt": "a", "stream_options": {"include_usage": "x"}},
           {"messages": MESSAGES, "chat_template_kwargs": {"messages": 1}},
           {"messages": MESSAGES, "tool_choice": {"type": "function"}},
           {"token_ids": [1], "sampling_params": [1]}, {"tokens": [10**9]}, {"model": ["x"]}]


def test_nothing_a_client_sends_stops_the_server(served):
  client, _, service, http = served
  for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
               "/inference/v1/generate"):
    for body in HOSTILE:
      status, reply = raw(http, path, body)
      assert 400 <= status < 500 and set(reply["error"]) == {"message", "type", "param",
                                                             "code"}, (path, body, reply)
  assert service.counters["http_errors"] == 0  # no 500 among them
  assert client.completions.create(model="tiny", prompt="a", max_tokens=2).choices


def test_the_client_errors_are_the_openai_exceptions(served):
  client, _, _, _ = served
  with pytest.raises(openai.BadRequestError, match="n: 5 is more"):
    client.chat.completions.create(model="tiny", messages=MESSAGES, n=MAX_SAMPLES + 1)


def test_a_client_that_goes_away_mid_stream_frees_its_request(served, monkeypatch):
  _, _, service, http = served
  scheduler = service.scheduler
  drawn = scheduler.metrics()["generated_tokens"]
  with Hold(scheduler) as hold:  # the sample is mid-way when the client leaves
    with httpx.stream("POST", http.url + "/completions", timeout=60,
                      json={"prompt": "a", "max_tokens": 60, "stream": True},
                      headers={"Authorization": f"Bearer {TOKEN}"}) as reply:
      first = json.loads(next(reply.iter_lines()).removeprefix("data: "))
      arrived = cancel_arrived(scheduler, monkeypatch, first["id"].removeprefix("cmpl-"))
      hold.wait()
    assert arrived.wait(20), "the server did not cancel the request of a closed stream"
  deadline = time.monotonic() + 20
  while scheduler.has_work() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not scheduler.has_work()
  assert scheduler.metrics()["generated_tokens"] - drawn < 60
  assert service.metrics()["http_errors"] == 0


def test_calls_beyond_max_concurrent_are_refused_busy(served):
  _, _, service, _ = served
  small = openai_http.start_http(service, model_name="tiny", max_concurrent=1,
                                 security=ServerSecurity(token=TOKEN.encode()))
  client = openai.OpenAI(base_url=small.url, api_key=TOKEN, max_retries=0, timeout=60)
  try:
    with Hold(service.scheduler) as hold:  # the first call runs until released
      stream = client.completions.create(model="tiny", prompt="a", max_tokens=8,
                                         stream=True)
      hold.wait()
      with pytest.raises(openai.RateLimitError, match="1 calls already running"):
        client.models.list()
      hold.release()
      assert [c.choices[0].finish_reason for c in stream][-1] == "length"
    assert client.models.list().data[0].id == "tiny"  # the slot is free again
  finally:
    small.stop()
  assert service.counters["http_refused_busy"] == 1


def test_responses_carry_the_version_that_sampled_them(served):
  client, grpc_client, service, _ = served
  service.update_params(service.scheduler.params, 3)  # the same weights, a new version
  reply = client.completions.create(model="tiny", prompt="a", max_tokens=2)
  assert reply.model_extra["policy_version"] == grpc_client.health().weights_version == 3
  assert reply.choices[0].model_extra["policy_versions"] == {"first": 3, "last": 3}


def test_a_swap_mid_sample_reports_both_versions(served):
  _, _, service, _ = served
  params = service.scheduler.params
  scheduler = Scheduler(service.scheduler.engine, params, prompt_buckets=(16, 32, 48),
                        update_policy="swap_now")  # the module's engine: compiled already
  swapping = SamplerService(scheduler, TOKENIZER)
  swapping.start()
  http = openai_http.start_http(swapping, model_name="tiny")
  client = openai.OpenAI(base_url=http.url, api_key="none", max_retries=0, timeout=60)
  try:
    with Hold(scheduler) as hold:
      stream = client.completions.create(model="tiny", prompt="a", max_tokens=12,
                                         stream=True)
      hold.wait()  # tokens of version 0 drawn, the sample still runs
      swapping.update_params(params, 1)
    last = [c for c in stream if c.choices][-1]
    assert last.choices[0].model_extra["policy_versions"] == {"first": 0, "last": 1}
    assert last.model_extra["policy_version"] == 1
  finally:
    http.stop()
    swapping.stop()


def test_http_port_is_validated(monkeypatch):
  for value, message in ((-2, "server.http_port"), (50051, "must differ")):
    config = serve_config()
    config.server.http_port = value
    with pytest.raises(ConfigError, match=message):
      serve_config_lib.validate_serve_config(config)
  config = serve_config()
  config.server.http_port = 0
  serve_config_lib.validate_serve_config(config)
  find_spec = serve_config_lib.importlib.util.find_spec
  monkeypatch.setattr(serve_config_lib.importlib.util, "find_spec",
                      lambda name: None if name == "aiohttp" else find_spec(name))
  with pytest.raises(ConfigError, match="needs aiohttp"):
    serve_config_lib.validate_serve_config(config)


def test_a_taken_http_port_is_one_line_before_the_model_loads():
  taken, port, _ = server_lib.listen("localhost", 0)
  try:
    config = serve_config()
    config.server.http_port = port
    with pytest.raises(ConfigError, match=f"^config.server.http_port: {port}: could not"):
      server_lib.check_http_port(config)
  finally:
    taken.stop(None)
