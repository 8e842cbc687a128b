"""Engine and scheduler: exactness against the uncached model, continuous batching,
seeds, FIRE, stops, compilation counts, cancellation and weight updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import QueueFull
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from tests.sampling.tiny_engine import VOCAB
from tests.sampling.tiny_engine import CONFIG
from tests.sampling.tiny_engine import NEWLINE
from tests.sampling.tiny_engine import BUCKETS
from tests.sampling.tiny_engine import peaked_params
from tests.sampling.tiny_engine import MODEL
from tests.sampling.tiny_engine import PARAMS
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import FORWARD
from tests.sampling.tiny_engine import scheduler
from tests.sampling.tiny_engine import prompts

def full_logprobs(prompt, tokens, temperature=1.0):
  """log_softmax(logits / T) of every generated token, from an uncached forward pass."""
  sequence = jnp.asarray([prompt + tokens], jnp.int32)
  logits = np.asarray(FORWARD(PARAMS, sequence))[0, len(prompt) - 1:-1] / temperature
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
      logits = FORWARD(PARAMS, jnp.asarray([sequence], jnp.int32))
      sequence.append(int(jnp.argmax(logits[0, -1])))
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


def test_continuous_batching_gives_each_request_its_solo_tokens():
  batch = prompts(7, seed=3)
  params = [sampling.SamplingParams(max_new_tokens=3 + 4 * i, seed=10 + i, n=1 + i % 3,
                                    stop_token_ids=(1, 2), top_k=(i % 2) * 10,
                                    top_p=0.9 if i == 3 else 1.0)
            for i in range(len(batch))]
  together = scheduler().generate(batch, params)
  for prompt, param, samples in zip(batch, params, together):
    alone = scheduler().generate([prompt], param)[0]
    assert [c.token_ids for c in samples] == [c.token_ids for c in alone]
    for sample in samples:
      assert len(sample.token_ids) <= param.max_new_tokens
      if sample.finish_reason == "stop":
        assert sample.token_ids[-1] in (1, 2)
        assert not set(sample.token_ids[:-1]) & {1, 2}
      else:
        assert len(sample.token_ids) == param.max_new_tokens


def test_n_samples_share_one_prefill_and_differ():
  engine = sampling.Engine(MODEL, num_slots=4, cache_length=40)
  sched = Scheduler(engine, PARAMS, prompt_buckets=BUCKETS)
  out = sched.generate(prompts(1, seed=4), sampling.SamplingParams(
      n=6, max_new_tokens=8, seed=1))[0]
  assert [c.sample_index for c in out] == list(range(6))
  assert len({tuple(c.token_ids) for c in out}) > 1
  assert engine.compilations()["prefill"] == 1


def test_seed_reproduces_and_a_drawn_seed_is_reported():
  prompt = prompts(1, seed=5)
  params = sampling.SamplingParams(max_new_tokens=8)
  first = scheduler(seed=1).generate(prompt, params)[0][0]
  again = scheduler(seed=2).generate(prompt, params.replace(seed=first.seed))[0][0]
  assert first.token_ids == again.token_ids


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
    logits = np.asarray(FORWARD(PARAMS, jnp.asarray([prompt + tokens])))[0, len(prompt) - 1:-1]
    _, regular = full_logprobs(prompt, tokens, temperature=0.5)
    for step, token in enumerate(tokens):
      hot = step == 0 or tokens[step - 1] in newline
      hot_steps += hot
      expected = hot_logprob(logits[step], token) if hot else regular[step, token]
      np.testing.assert_allclose(completion.sampled_logprobs[step], expected, atol=1e-4)
  assert hot_steps > 8


def test_cancel_frees_the_slot_and_reports_cancelled():
  sched = scheduler(steps_per_sync=2)
  long_id = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=25, seed=0))
  completions = sched.step()
  sched.cancel(long_id)
  completions += sched.run()
  (cancelled,) = [c for c in completions if c.request_id == long_id]
  assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) < 25
  assert sched.metrics()["slots_busy"] == 0 and not sched.has_work()


def test_a_failing_token_callback_ends_only_its_request():
  sched = scheduler()
  def explode(*args):
    raise RuntimeError("consumer gone")
  bad = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=5, seed=0),
                     on_token=explode)
  good = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=5, seed=0))
  by_id = {c.request_id: c for c in sched.run()}
  assert by_id[bad].finish_reason == "error" and "consumer gone" in by_id[bad].error
  assert by_id[good].finish_reason == "length"


def test_a_request_that_fails_starts_none_of_its_waiting_samples():
  sched = scheduler()
  def explode(*args):
    raise RuntimeError("consumer gone")
  sched.submit(prompts(1)[0], sampling.SamplingParams(n=ENGINE.num_slots + 3,
                                                      max_new_tokens=5, seed=0),
               on_token=explode)
  out = sorted(sched.run(), key=lambda c: c.sample_index)
  assert out[0].finish_reason == "error"
  never_started = out[ENGINE.num_slots:]  # queued behind the slots when it failed
  assert [(c.finish_reason, c.token_ids) for c in never_started] == [("cancelled", [])] * 3
  assert not sched.has_work()


@pytest.mark.parametrize("policy", ["finish_old", "swap_now"])
def test_weight_update_policies(policy):
  _, other = peaked_params(seed=1)
  sched = scheduler(update_policy=policy, steps_per_sync=2)
  first = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=12, seed=0,
                                                              temperature=0))
  sched.step()
  sched.update_params(other, version=1)
  second = sched.submit(prompts(1)[0], sampling.SamplingParams(max_new_tokens=4, seed=0,
                                                               temperature=0))
  by_id = {c.request_id: c for c in sched.run()}
  assert by_id[second].weights_version == (1, 1)
  assert by_id[second].token_versions == [1] * 4
  if policy == "finish_old":
    assert by_id[first].weights_version == (0, 0)
    assert by_id[first].token_versions == [0] * 12
    assert by_id[first].token_ids == scheduler().generate(
        prompts(1), sampling.SamplingParams(max_new_tokens=12, temperature=0))[0][0].token_ids
  else:
    assert by_id[first].weights_version == (0, 1)
    # Each token is drawn from the logits of the forward before it: the prefill's and
    # the first dispatch's two forwards (version 0) drew tokens 0-2, the forwards after
    # the swap (version 1) the rest (partial rollouts, token by token).
    assert by_id[first].token_versions == [0] * 3 + [1] * 9


def test_bad_requests_name_the_field():
  sched = scheduler(max_queue=1)
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingParams(temperature=-1)
  with pytest.raises(ValueError, match="fire.top_k"):
    sampling.FireSchedule(top_k=-2)
  with pytest.raises(ValueError, match="stop_token_ids"):
    sched.submit([3], sampling.SamplingParams(max_new_tokens=2, stop_token_ids=(VOCAB,)))
  with pytest.raises(ValueError, match="max_new_tokens"):
    sched.submit([3] * 10, sampling.SamplingParams(max_new_tokens=35))
  with pytest.raises(ValueError, match="prompt_ids"):
    sched.submit([], sampling.SamplingParams(max_new_tokens=2))
  with pytest.raises(ValueError, match="prompt bucket"):
    sched.submit([3] * 17, sampling.SamplingParams(max_new_tokens=2))
  sched.submit([3], sampling.SamplingParams(max_new_tokens=2))
  with pytest.raises(QueueFull):
    sched.submit([3], sampling.SamplingParams(max_new_tokens=2))


def test_prompts_of_one_seeded_call_draw_independent_numbers():
  """One SamplingParams with a seed for many prompts: prompt k samples with
  prompt_seed(seed, k), so equal prompts get different samples (before, sample i of every
  prompt drew the same uniforms and their outcomes were correlated across the batch)."""
  prompt = prompts(1, seed=4)[0]
  params = sampling.SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
  out = scheduler().generate([prompt] * 6, params)
  assert len({tuple(c.token_ids) for (c,) in out}) >= 5  # one seed for all: 1
  assert [c.seed for (c,) in out] == [sampling.prompt_seed(5, k) for k in range(6)]
  assert out[0][0].token_ids == scheduler().generate([prompt], params)[0][0].token_ids


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
