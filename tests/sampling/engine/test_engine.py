"""The Engine: exactness against the uncached model, one prefill for n samples, prefill
rows, FIRE, and the decode state's programs (the scheduler's own tests:
tests/sampling/scheduler/test_scheduler.py)."""

import jax
import numpy as np
import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from tests.sampling.tiny_engine import VOCAB
from tests.sampling.tiny_engine import BUCKETS
from tests.sampling.tiny_engine import MODEL
from tests.sampling.tiny_engine import PARAMS
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import FORWARD
from tests.sampling.tiny_engine import scheduler
from tests.sampling.tiny_engine import prompts


def uncached_logits(sequence):
  """[len(sequence), V] logits of one uncached forward over `sequence`, right-padded to
  the cache length so that every call runs one compiled program (the model is causal:
  tokens after a position do not change its logits)."""
  padded = np.zeros((1, ENGINE.cache_length), np.int32)
  padded[0, :len(sequence)] = sequence
  return np.asarray(FORWARD(PARAMS, padded))[0, :len(sequence)]


def full_logprobs(prompt, tokens, temperature=1.0):
  """log_softmax(logits / T) of every generated token, from an uncached forward pass."""
  logits = uncached_logits(prompt + tokens)[len(prompt) - 1:-1] / temperature
  logits = logits - logits.max(-1, keepdims=True)
  table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return table[np.arange(len(tokens)), tokens], table


@pytest.mark.slow
def test_greedy_equals_an_uncached_argmax_loop():
  batch = prompts(6, seed=1)
  out = scheduler().generate(batch, sampling.SamplingParams(temperature=0, max_new_tokens=10))
  for prompt, (completion,) in zip(batch, out):
    sequence = list(prompt)
    for _ in range(10):
      sequence.append(int(np.argmax(uncached_logits(sequence)[-1])))
    assert completion.token_ids == sequence[len(prompt):]
    assert completion.finish_reason == "length"


def test_model_logprobs_equal_the_trainers_recomputation():
  batch = prompts(3, seed=2)
  params = sampling.SamplingParams(temperature=0.8, top_k=5, max_new_tokens=12, seed=3)
  for prompt, (completion,) in zip(batch, scheduler().generate(batch, params)):
    model_logprobs, _ = full_logprobs(prompt, completion.token_ids)
    np.testing.assert_allclose(completion.model_logprobs, model_logprobs, atol=1e-5)
    # The sampled log-probs are under T=0.8 and top-5, renormalised.
    _, tempered = full_logprobs(prompt, completion.token_ids, temperature=0.8)
    for step, token in enumerate(completion.token_ids):
      row = tempered[step]
      kept = row >= np.sort(row)[-5]
      expected = row[token] - np.log(np.exp(row[kept]).sum())
      np.testing.assert_allclose(completion.sampled_logprobs[step], expected, atol=1e-5)


def test_n_samples_share_one_prefill_and_differ():
  engine = sampling.Engine(MODEL, num_slots=4, cache_length=40)
  sched = Scheduler(engine, PARAMS, prompt_buckets=BUCKETS)
  out = sched.generate(prompts(1, seed=4), sampling.SamplingParams(
      n=6, max_new_tokens=8, seed=1))[0]
  assert [c.sample_index for c in out] == list(range(6))
  assert len({tuple(c.token_ids) for c in out}) > 1
  assert engine.compilations()["prefill"] == 1


def test_prefill_rows_are_the_prefill_padded_and_insert_alike():
  """prefill_rows: each prompt's row alone, KV zero-padded to pad_to; inserted, a row
  samples the same tokens as row r of the unpadded prefix (one insert program)."""
  batch = prompts(3, seed=9)
  tokens = np.zeros((4, 16), np.int32)
  lengths = np.ones((4,), np.int32)
  for r, prompt in enumerate(batch):
    tokens[r, :len(prompt)], lengths[r] = prompt, len(prompt)
  whole = ENGINE.prefill(PARAMS, tokens, lengths)
  rows = ENGINE.prefill_rows(PARAMS, tokens, lengths, pad_to=24)
  assert len(rows) == 4
  for r, row in enumerate(rows):
    np.testing.assert_array_equal(row.logits, whole.logits[r:r + 1])
    for key, full in zip(jax.tree.leaves(row.keys), jax.tree.leaves(whole.keys)):
      assert key.shape[-4] == 1 and key.shape[-1] == 24  # [.., 1, K, D, positions]
      np.testing.assert_array_equal(key[..., :16], np.take(full, [r], axis=-4))
      assert not np.any(np.asarray(key[..., 16:]))
    for value, full in zip(jax.tree.leaves(row.values), jax.tree.leaves(whole.values)):
      assert value.shape[-4] == 1 and value.shape[-2] == 24  # [.., 1, K, positions, D]
      np.testing.assert_array_equal(value[..., :16, :], np.take(full, [r], axis=-4))
      assert not np.any(np.asarray(value[..., 16:, :]))
  params = sampling.SamplingParams(max_new_tokens=6, seed=3)
  drawn = []
  for prefix, row in ((whole, 2), (rows[2], 0)):
    state = ENGINE.insert(prefix, ENGINE.init_decode_state(), 1, row=row,
                          sampling=ENGINE.slot_sampling(params, 0))
    state, result = ENGINE.generate_steps(PARAMS, state, 6)
    drawn.append(np.asarray(result.tokens[:, 1]))
  np.testing.assert_array_equal(drawn[0], drawn[1])
  with pytest.raises(ValueError, match="pad_to=12"):
    ENGINE.prefill_rows(PARAMS, tokens, lengths, pad_to=12)


def sample_first_tokens(fire, draws=400, max_new_tokens=3):
  prompt = prompts(1, seed=8)[0]
  regular = sampling.SamplingParams(temperature=0.5, max_new_tokens=max_new_tokens, seed=0,
                                    n=draws, fire=fire)
  sched = Scheduler(sampling.Engine(MODEL, num_slots=32, cache_length=24), PARAMS,
                    prompt_buckets=(16,), steps_per_sync=4)
  return prompt, sched.generate([prompt], regular)[0]


def entropy(tokens):
  freq = np.bincount(tokens, minlength=VOCAB) / len(tokens)
  freq = freq[freq > 0]
  return float(-(freq * np.log(freq)).sum())


@pytest.mark.slow
def test_fire_heats_the_first_token_only():
  prompt, plain = sample_first_tokens(None)
  _, fired = sample_first_tokens(sampling.FireSchedule(temperature=30.0, top_k=16))
  plain_entropy = entropy([c.token_ids[0] for c in plain])
  fired_entropy = entropy([c.token_ids[0] for c in fired])
  # Top-16 at T=30 is close to uniform over 16 tokens (entropy ≈ log 16 = 2.77).
  assert fired_entropy > plain_entropy + 1.0 and fired_entropy > 2.3, (plain_entropy,
                                                                       fired_entropy)
  assert len({c.token_ids[0] for c in fired}) <= 16
  for completion in fired[:20]:
    _, regular = full_logprobs(prompt, completion.token_ids, temperature=0.5)
    later = regular[np.arange(1, 3), completion.token_ids[1:]]
    # After the first token the draws come from the regular distribution, exactly.
    np.testing.assert_allclose(completion.sampled_logprobs[1:], later, atol=1e-5)


def hot_logprob(row_logits, token, temperature=30.0, top_k=16):
  scaled = row_logits / temperature
  kept = scaled >= np.sort(scaled)[-top_k]
  return scaled[token] - np.log(np.exp(scaled[kept]).sum())


def test_fire_every_line_heats_after_each_newline_token():
  # Half the vocabulary counts as "ends a line", so hot steps happen often.
  newline = tuple(range(8, 40))
  engine = sampling.Engine(MODEL, num_slots=4, cache_length=40, newline_token_ids=newline)
  fire = sampling.FireSchedule(temperature=30.0, top_k=16, every_line=True)
  params = sampling.SamplingParams(temperature=0.5, max_new_tokens=16, seed=3, n=4, fire=fire)
  prompt = prompts(1, seed=9)[0]
  hot_steps = 0
  for completion in Scheduler(engine, PARAMS, prompt_buckets=BUCKETS).generate(
      [prompt], params)[0]:
    tokens = completion.token_ids
    logits = uncached_logits(prompt + tokens)[len(prompt) - 1:-1]
    _, regular = full_logprobs(prompt, tokens, temperature=0.5)
    for step, token in enumerate(tokens):
      hot = step == 0 or tokens[step - 1] in newline
      hot_steps += hot
      expected = hot_logprob(logits[step], token) if hot else regular[step, token]
      np.testing.assert_allclose(completion.sampled_logprobs[step], expected, atol=1e-4)
  assert hot_steps > 8


def test_decode_state_carries_tokens_not_logits_and_truncates_only_when_asked():
  """No [S, V] logits in the decode state (the next token is drawn inside the step), and
  the truncating variant of generate compiles only while a sample that asked for top-k
  may still be drawing (at most max_new_tokens steps after its insert)."""
  engine = sampling.Engine(MODEL, num_slots=2, cache_length=40)
  state = engine.init_decode_state()
  assert not any(VOCAB in leaf.shape for leaf in jax.tree.leaves(state)), state
  prefix = engine.prefill(PARAMS, np.full((1, 8), 9, np.int32), np.asarray([5], np.int32))
  plain = sampling.SamplingParams(max_new_tokens=6, seed=1)
  state = engine.insert(prefix, state, 0, sampling=engine.slot_sampling(plain, 0))
  state, _ = engine.generate_steps(PARAMS, state, 2)
  assert set(engine.compilations()) == {"prefill", "insert", "generate[2]"}
  topk = plain.replace(top_k=5, max_new_tokens=3)
  state = engine.insert(prefix, state, 1, sampling=engine.slot_sampling(topk, 0))
  state, _ = engine.generate_steps(PARAMS, state, 2)
  state, _ = engine.generate_steps(PARAMS, state, 1)  # its 3rd and last step
  state, _ = engine.generate_steps(PARAMS, state, 2)  # slot 1 has finished by now
  compiled = engine.compilations()
  assert compiled["generate[2]+truncate"] == 1 and compiled["generate[1]+truncate"] == 1
  assert compiled["generate[2]"] == 1 and "generate[1]" not in compiled
