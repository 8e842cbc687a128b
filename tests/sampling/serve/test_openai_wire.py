"""OpenAI's request fields → SamplingParams, and the response pieces: each field where the
OpenAI / vLLM docs put it, every refusal naming its field (no HTTP here)."""

from __future__ import annotations

import json

import pytest

from rlhf_jax import models
from rlhf_jax.sampling.protocol import Completion
from rlhf_jax.sampling.serve import openai_wire as ow
from tests.fakes import ALPHABET
from tests.fakes import fake_tokenizer

TOKENIZER = fake_tokenizer()


def params(body, *, chat=True, prompt_length=10, cache_length=64):
  return ow.sampling_params(body, chat=chat, prompt_length=prompt_length,
                            cache_length=cache_length, tokenizer=TOKENIZER)


def completion(ids, versions=(0, 0), reason="stop", index=0):
  return Completion(request_id="r", sample_index=index, prompt_ids=[1], token_ids=ids,
                    sampled_logprobs=[-1.0] * len(ids), model_logprobs=[-0.5] * len(ids),
                    finish_reason=reason, seed=0, weights_version=versions)


def test_fields_map_to_the_engines_sampling_params():
  got = params({"temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1, "seed": 3,
                "n": 2, "max_tokens": 7, "max_completion_tokens": 9, "stop": ["?"],
                "stop_token_ids": [5]})
  im_end = TOKENIZER.backend.token_to_id("<|im_end|>")
  assert (got.temperature, got.top_p, got.top_k, got.min_p, got.seed, got.n) == (
      0.5, 0.9, 0, 0.1, 3, 2)
  assert got.max_new_tokens == 9  # max_completion_tokens wins, as OpenAI's
  assert got.stop_token_ids == (TOKENIZER.encode("?")[0], 5, TOKENIZER.eos_id, im_end)
  assert params({}, chat=False).stop_token_ids == (TOKENIZER.eos_id,)
  assert params({"ignore_eos": True}).stop_token_ids == ()


def test_default_lengths_are_openais():
  assert params({}, chat=False, prompt_length=10).max_new_tokens == 16
  assert params({}, chat=False, prompt_length=60).max_new_tokens == 4
  assert params({}, chat=True, prompt_length=10).max_new_tokens == 54


@pytest.mark.parametrize("body,chat,field", [
    ({"temperature": "hot"}, True, "temperature"),
    ({"temperature": -1.0}, True, "temperature"),
    ({"top_p": 0.0}, True, "top_p"),
    ({"n": 0}, True, "n"),
    ({"seed": True}, True, "seed"),
    ({"max_tokens": 55}, True, "max_tokens"),
    ({"max_completion_tokens": 0}, True, "max_completion_tokens"),
    ({"frequency_penalty": 0.5}, True, "frequency_penalty"),
    ({"top_logprobs": 3}, True, "top_logprobs"),
    ({"logprobs": 1}, True, "logprobs"),
    ({"logprobs": 2}, False, "logprobs"),
    ({"stop": "ab"}, True, "stop"),
    ({"stop": ["?"] * 17}, True, "stop"),
    ({"stop_token_ids": [-1]}, True, "stop_token_ids"),
    ({"stream": "yes"}, True, "stream"),
    ({"return_token_ids": 1}, False, "return_token_ids"),
    ({"stream_options": True}, True, "stream_options"),
])
def test_refusals_name_their_field(body, chat, field):
  with pytest.raises(ow.WireError) as raised:
    params(body, chat=chat)
  assert raised.value.status == 400 and raised.value.param == field
  assert raised.value.message.startswith(field)
  assert set(raised.value.body()["error"]) == {"message", "type", "param", "code"}


def test_unknown_fields_and_bodies_that_are_not_objects():
  with pytest.raises(ow.WireError, match="^bogus: "):
    ow.check_fields({"messages": [], "bogus": 1}, ow.CHAT_FIELDS)
  with pytest.raises(ow.WireError, match="JSON object"):
    ow.check_fields([1, 2], ow.CHAT_FIELDS)


def test_versions_span_a_swap_and_usage_counts_every_sample():
  samples = [completion([1, 2], (3, 4)), completion([5], (4, 4), index=1)]
  assert ow.versions(samples) == {"policy_version": 4,
                                  "policy_versions": {"first": 3, "last": 4}}
  assert ow.usage(6, samples) == {"prompt_tokens": 6, "completion_tokens": 3,
                                  "total_tokens": 9}
  assert ow.finish_reason(completion([1], reason="cancelled")) == "abort"  # vLLM's


def test_logprob_blocks_in_both_shapes():
  ids = TOKENIZER.encode("ab c")
  chat = ow.token_logprobs(TOKENIZER, ids, [-1.0, -2.0, -3.0, -4.0], chat=True)
  assert [e["token"] for e in chat["content"]] == ["a", "b", " ", "c"]
  assert chat["content"][3] == {"token": "c", "logprob": -4.0, "bytes": [99],
                                "top_logprobs": []}
  text = ow.token_logprobs(TOKENIZER, ids, [-1.0, -2.0, -3.0, -4.0], chat=False)
  assert text["text_offset"] == [0, 1, 2, 3] and text["tokens"] == ["a", "b", " ", "c"]
  shape = ow.ChatShape(TOKENIZER)(completion(ids + [TOKENIZER.eos_id]),
                                  {"return_token_ids": True})
  assert shape["message"] == {"role": "assistant", "content": "ab c"}
  assert shape["token_ids"] == ids + [TOKENIZER.eos_id] and shape["logprobs"] is None


def test_a_sampled_hermes_call_is_a_tool_call_whole_and_streamed():
  tokenizer = fake_tokenizer(ALPHABET + '<>/_{}":,')
  ids = tokenizer.encode('ok<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
  shape = ow.ChatShape(tokenizer, tool_format="hermes")
  choice = shape(completion(ids + [tokenizer.eos_id]), {})
  (call,) = choice["message"]["tool_calls"]
  assert choice["message"]["content"] == "ok" and choice["finish_reason"] == "tool_calls"
  assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
      "add", {"a": 1})
  assert shape.chunk(0, "ok", ids[:2], [-1.0, -1.0], {})["delta"] == {}  # held to the end
  last = shape.finish(completion(ids, reason="length"), {})
  assert last["delta"]["tool_calls"][0]["index"] == 0 and last["finish_reason"] == "length"


def test_streamed_text_deltas_join_to_the_tokenizers_decode():
  corpus = ["héllo wörld ✓ naïve café", "streams of text 12 + 30 = 42"] * 4
  tokenizer = models.train_bpe_tokenizer(corpus, vocab_size=300)
  text = "naïve ✓ wörld 42 café ✓✓"
  ids = tokenizer.encode(text)
  deltas = ow.TextDeltas(tokenizer)
  pieces = [deltas.add([t]) for t in ids]
  assert "".join(pieces) + deltas.rest() == tokenizer.decode(ids) == text
  assert not any("\ufffd" in p for p in pieces)  # a split character waits for its bytes
  cut = ow.TextDeltas(tokenizer)  # a sample that ends mid-character keeps its last bytes
  partial = [cut.add([t]) for t in ids[:-1]]
  assert "".join(partial) + cut.rest() == tokenizer.decode(ids[:-1])
