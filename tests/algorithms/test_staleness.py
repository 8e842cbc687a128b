"""Staleness fidelity: policy versions on rows, decoupled PPO in `prepare`, and dynamic
sampling's surplus (discarded as in verl, or kept with a maximum age).

References are NumPy loops written from docs/formulas.md#decoupled-ppo (π_prox
centres the clip, w = π_prox / π_behav weights the token) and #dapo (dynamic sampling).
"""

import collections
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax import kernels
from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rollout import DynamicSamplingRollout
from rlhf_jax.rollout import Group
from rlhf_jax.rollout import GroupGenerator
from rlhf_jax.rollout import pack_groups
from rlhf_jax.rollout import windows as windowed
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling.protocol import Completion
from tests.rollout.scripted_groups import MIXED
from tests.rollout.scripted_groups import SOLVED
from tests.rollout.scripted_groups import group
from tests.training.runs import preset

CURRENT = 5  # the policy version being learned from
# Per row: (response length, window start, per-token versions). Row 4 is a T-PPO row whose
# first window (version 3) is context only and whose trained window spans versions 4 and 5
# (a sampler that swapped weights mid-window); rows 2 and 3 are whole stale responses.
ROWS = [(6, 0, [5] * 6), (4, 0, [5] * 4), (6, 0, [4] * 6), (5, 0, [2] * 5),
        (6, 2, [3, 3, 4, 4, 5, 5]), (3, 0, [5] * 3)]
RESPONSE = 6


def mixed_batch(seed=0, stale_gap=1.0):
  """A batch of ROWS with sampler log-probs, the trainer's (float noise away from the
  sampler's on fresh tokens, `stale_gap`-sized differences on stale ones, with some
  behaviour weights beyond [1/5, 5]) and the current policy's log-probs."""
  rng = np.random.default_rng(seed)
  lengths = [n for n, _, _ in ROWS]
  sampler = [list(-rng.uniform(0.05, 3.0, n)) for n in lengths]
  batch = batch_lib.build_rollout_batch(
      [[1, 2]] * len(ROWS), [list(rng.integers(3, 30, n)) for n in lengths], sampler,
      [1.0, -1.0] * (len(ROWS) // 2), [False] * len(ROWS), [0, 0, 1, 1, 2, 2],
      prompt_length=2, response_length=RESPONSE, pad_id=0,
      window_starts=[s for _, s, _ in ROWS], finished=[s == 0 for _, s, _ in ROWS],
      token_versions=[v for _, _, v in ROWS])
  mask = np.asarray(batch.response_mask)
  stale = (np.asarray(batch.token_versions) != CURRENT) * mask
  gap = rng.normal(size=mask.shape) * stale_gap
  gap[2, 0], gap[3, 1] = 2.0, -2.0  # w = e^2 > 5 and e^-2 < 1/5
  noise = rng.normal(size=mask.shape) * 1e-6
  trainer = (np.asarray(batch.sampler_logprobs) + np.where(stale > 0, gap, noise)) * mask
  theta = trainer + rng.normal(size=mask.shape) * 0.3 * mask
  return batch, trainer.astype(np.float32), theta.astype(np.float32)


def algorithm(staleness_mode="mis_token", cap=5.0):
  a = preset("dapo").algorithm
  a.overlong.penalty = False  # its buffer is longer than these responses
  a.staleness.mode, a.staleness.cap = staleness_mode, cap
  return a


def run_prepare(a, batch, trainer, *, correction="none", version=CURRENT):
  @jax.jit
  def go(batch, trainer, version):
    return ppo_family.prepare(a, batch, old_logprobs=trainer, ref_logprobs=None, values=None,
                              kl_coef=jnp.float32(0.0), correction=correction, group_size=2,
                              version=version)
  return go(batch_lib.as_device(batch), trainer,
            None if version is None else jnp.int32(version))


def reference_weights(trainer, sampler, versions, lengths, starts, *, correction, c_corr,
                      stale_mode, cap):
  """Per token, from docs/formulas.md#decoupled-ppo: (π_old, w, keep), 0 off the sampled
  tokens. A token of version CURRENT is fresh, also in a row that spans versions (the
  sampler recomputes the KV cache of a sample in flight at a swap: sampling/scheduler/swaps.py)."""
  old, weight, keep = np.zeros_like(trainer), np.zeros_like(trainer), np.zeros_like(trainer)
  for b in range(trainer.shape[0]):
    for t in range(trainer.shape[1]):
      if not starts[b] <= t < lengths[b]:
        continue
      ratio = np.exp(float(trainer[b, t]) - float(sampler[b, t]))
      if versions[b, t] == CURRENT:  # fresh: π_prox = π_behav
        if correction == "none":
          old[b, t], weight[b, t], keep[b, t] = sampler[b, t], 1.0, 1.0
        else:  # TIS for the sampler–trainer mismatch
          old[b, t], weight[b, t], keep[b, t] = trainer[b, t], min(ratio, c_corr), 1.0
      else:  # stale: the clip is centred on π_prox; w = π_prox / π_behav
        old[b, t] = trainer[b, t]
        if stale_mode == "tis":
          weight[b, t], keep[b, t] = min(ratio, cap), 1.0
        else:  # masked: w = 0, still in the loss mask (AReaL's behaviour mask)
          inside = 1.0 / cap <= ratio <= cap
          weight[b, t], keep[b, t] = ratio * inside, 1.0
  return old, weight, keep


def reference_loss(theta, old, weight, keep, advantages, sampled, clip_low, clip_high):
  """Token-mean of w · max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high)), ρ = π_θ / π_old."""
  total = count = 0.0
  for b in range(theta.shape[0]):
    for t in range(theta.shape[1]):
      if sampled[b, t] and keep[b, t]:
        rho = np.exp(float(theta[b, t]) - float(old[b, t]))
        a = float(advantages[b, t])
        clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
        total += weight[b, t] * max(-a * rho, -a * clipped)
        count += 1
  return total / count


def actor_loss(a, theta, batch):
  return ppo_family.actor_loss(a, theta, jnp.zeros_like(theta), batch,
                               ppo_family.normalizers(a, batch))


@pytest.mark.parametrize("correction", ["none", "tis"])
@pytest.mark.parametrize("stale_mode", ["mis_token", "tis"])
def test_decoupled_ppo_weights_and_loss_match_a_numpy_loop(correction, stale_mode):
  a = algorithm(stale_mode)
  batch, trainer, theta = mixed_batch()
  prepared, _, metrics = run_prepare(a, batch, trainer, correction=correction)
  sampler, versions = np.asarray(batch.sampler_logprobs), np.asarray(batch.token_versions)
  lengths, starts = [n for n, _, _ in ROWS], [s for _, s, _ in ROWS]
  old, weight, keep = reference_weights(trainer, sampler, versions, lengths, starts,
                                        correction=correction, c_corr=a.correction.threshold,
                                        stale_mode=stale_mode, cap=a.staleness.cap)
  sampled = np.asarray(batch.sampled_mask()) > 0
  np.testing.assert_allclose(np.asarray(prepared.old_logprobs)[sampled], old[sampled],
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(prepared.is_weights), weight, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(prepared.correction_mask), keep)
  assert (keep[2, 0], keep[3, 1]) == (1, 1)
  if stale_mode == "mis_token":
    assert (weight[2, 0], weight[3, 1]) == (0.0, 0.0)
  # The loss on independent advantages.
  advantages = np.random.default_rng(9).normal(size=theta.shape).astype(np.float32)
  prepared = prepared.replace(advantages=jnp.asarray(advantages) * prepared.response_mask)
  loss, _ = actor_loss(a, jnp.asarray(theta), prepared)
  expected = reference_loss(theta, old, weight, keep, advantages, sampled,
                            a.policy_loss.clip_low, a.policy_loss.clip_high)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  # Metrics: the mismatch over fresh tokens only, the lag of stale ones separately.
  stale = sampled & (versions != CURRENT)
  fresh = sampled & ~stale
  gap = np.abs(trainer - sampler)
  np.testing.assert_allclose(metrics["logprob_mismatch_max"], gap[fresh].max(), rtol=1e-5)
  assert metrics["logprob_mismatch_max"] < 1e-5  # float noise only
  np.testing.assert_allclose(metrics["staleness/stale_token_fraction"],
                             stale.sum() / sampled.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["staleness/mean_version_lag"],
                             (CURRENT - versions)[sampled].mean(), rtol=1e-6)
  assert metrics["staleness/max_version_lag"] == 3
  np.testing.assert_allclose(metrics["staleness/stale_logprob_gap"], gap[stale].mean(),
                             rtol=1e-5)
  ratio = np.exp(trainer - sampler)[stale]
  if stale_mode == "tis":
    np.testing.assert_allclose(metrics["staleness/weight_clipped_frac"],
                               np.mean(ratio > a.staleness.cap), rtol=1e-6)
  else:
    outside = (ratio < 1 / a.staleness.cap) | (ratio > a.staleness.cap)
    np.testing.assert_allclose(metrics["staleness/weight_masked_frac"], outside.mean(),
                               rtol=1e-6)


def areal_loss(theta, prox, behav, advantages, loss_mask, *, cap, clip_low, clip_high):
  """AReaL's decoupled loss (`ppo_actor_loss_fn`), in NumPy: the behaviour weight
  w = π_prox / π_behav is zeroed outside the cap (AReaL: w > cap; here the band
  [1/cap, cap] that mis_token keeps) and the surrogate summed over the loss mask is divided
  by the loss mask's count, masked tokens included."""
  ratio = np.exp(theta - prox)
  surrogate = np.maximum(-advantages * ratio,
                         -advantages * np.clip(ratio, 1 - clip_low, 1 + clip_high))
  w = np.exp(prox - behav)
  behaviour_mask = (w <= cap) & (w >= 1 / cap) & loss_mask
  w = np.where(behaviour_mask, w, 0.0)
  return np.where(loss_mask, surrogate * w, 0.0).sum() / loss_mask.sum(), behaviour_mask


def test_masked_stale_tokens_stay_in_the_token_mean_denominator():
  """staleness.mode='mis_token' masks a stale token with w outside [1/cap, cap] as AReaL
  does: w = 0, the token still counted by the token mean (the kept tokens' gradients are
  not scaled up by N / N_kept)."""
  a = algorithm("mis_token")
  batch, trainer, theta = mixed_batch()
  mask = np.asarray(batch.response_mask)
  batch = batch.replace(token_versions=np.where(mask > 0, CURRENT - 1, 0).astype(np.int32))
  prepared, _, _ = run_prepare(a, batch, trainer)
  advantages = np.random.default_rng(5).normal(size=theta.shape).astype(np.float32)
  prepared = prepared.replace(advantages=jnp.asarray(advantages) * prepared.response_mask)
  loss, _ = actor_loss(a, jnp.asarray(theta), prepared)
  sampled = np.asarray(batch.sampled_mask()) > 0
  expected, kept = areal_loss(theta.astype(np.float64), trainer.astype(np.float64),
                              np.asarray(batch.sampler_logprobs, np.float64), advantages,
                              sampled, cap=a.staleness.cap, clip_low=a.policy_loss.clip_low,
                              clip_high=a.policy_loss.clip_high)
  assert 0 < kept.sum() < sampled.sum()  # some stale tokens are masked
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  # Dropping them from the denominator would have scaled the loss by N / N_kept.
  assert abs(float(loss) - expected * sampled.sum() / kept.sum()) > 1e-3 * abs(expected)


def test_fresh_rows_give_exactly_the_ppo_loss():
  """Every token of the current version: w is exactly 1 and π_old the sampler's, whatever
  the trainer's float noise, so the loss is PPO's (and `version=None` agrees)."""
  a = algorithm()
  batch, trainer, theta = mixed_batch()
  mask = np.asarray(batch.response_mask)
  batch = batch.replace(token_versions=np.where(mask > 0, CURRENT, 0).astype(np.int32))
  prepared, _, metrics = run_prepare(a, batch, trainer)
  sampled = np.asarray(batch.sampled_mask())
  np.testing.assert_array_equal(np.asarray(prepared.is_weights), sampled)
  np.testing.assert_array_equal(np.asarray(prepared.correction_mask), sampled)
  np.testing.assert_array_equal(np.asarray(prepared.old_logprobs),
                                np.asarray(batch.sampler_logprobs))
  assert metrics["staleness/stale_token_fraction"] == 0
  assert metrics["staleness/mean_version_lag"] == 0
  advantages = jnp.asarray(np.random.default_rng(3).normal(size=theta.shape), jnp.float32)
  prepared = prepared.replace(advantages=advantages * prepared.response_mask)
  loss, _ = actor_loss(a, jnp.asarray(theta), prepared)
  ppo, _ = kernels.ppo_policy_loss(jnp.asarray(theta), batch.sampler_logprobs,
                                   prepared.advantages, sampled, clip_low=a.policy_loss.clip_low,
                                   clip_high=a.policy_loss.clip_high)
  assert float(loss) == float(ppo)
  unversioned, _, _ = run_prepare(a, batch, trainer, version=None)
  jax.tree.map(np.testing.assert_array_equal, unversioned, run_prepare(a, batch, trainer)[0])


def test_build_rollout_batch_checks_versions():
  batch = batch_lib.build_rollout_batch([[1]], [[2, 3]], [[0.0, 0.0]], [0.0], [False], [0],
                                        prompt_length=1, response_length=3, pad_id=0,
                                        token_versions=[[4, 5]])
  np.testing.assert_array_equal(batch.token_versions, [[4, 5, 0]])
  with pytest.raises(ValueError, match="row 0: 1 token versions for a response of 2 tokens"):
    batch_lib.build_rollout_batch([[1]], [[2, 3]], [[0.0, 0.0]], [0.0], [False], [0],
                                  prompt_length=1, response_length=3, pad_id=0,
                                  token_versions=[[4]])


# ------------------------------------------------------------------ versions on rows


class FakeTokenizer:
  pad_id, eos_id = 0, 1

  def encode(self, text):
    return [ord(c) % 50 + 2 for c in text]

  def decode(self, ids):
    return "x" * len(ids)


class FakeScorer:
  def score(self, examples, responses):
    return Scores([float(len(r) % 2) for r in responses], [len(r) % 2 == 1 for r in responses],
                  [""] * len(responses))


class VersionedSampler:
  """Returns n completions of 1 to 3 tokens, each generated with `weights_version`
  (and, when given, the per-token record `token_versions(length)`)."""

  def __init__(self, weights_version, token_versions=None):
    self.weights_version = weights_version
    self.token_versions = token_versions

  def generate(self, prompts, sampling):
    return [[Completion("r", i, list(p), [5] * (i % 3 + 1), [-0.5] * (i % 3 + 1),
                        [-0.5] * (i % 3 + 1), "stop", 0, self.weights_version,
                        token_versions=(self.token_versions(i % 3 + 1)
                                        if self.token_versions else []))
             for i in range(sampling.n)] for p in prompts]


def test_groups_and_their_rows_carry_the_sampling_version():
  generator = GroupGenerator(VersionedSampler((7, 8)), FakeScorer(),
                             PromptFormat(FakeTokenizer(), prompt_length=8),
                             sampling=SamplingParams(n=3), seed=0)
  groups = generator.generate_groups([Example("ab", "1", "arith"), Example("c", "1", "arith")])
  # With no per-token record, a sample whose weights changed mid-generation counts as
  # its first (older) version.
  assert [g.versions for g in groups] == [[[7], [7, 7], [7, 7, 7]]] * 2
  assert groups[0].version == 7
  batch = pack_groups(groups, prompt_length=8, response_length=4, pad_id=0).batch
  mask = np.asarray(batch.response_mask) > 0
  assert np.all(batch.token_versions[mask] == 7) and np.all(batch.token_versions[~mask] == 0)
  # Offline data and old checkpoints: version 0, the starting policy.
  data = json.loads(json.dumps(dataclasses.asdict(groups[0])))
  del data["versions"]
  old = Group.from_json(data)
  assert old.versions is None and old.version == 0
  packed = pack_groups([old], prompt_length=8, response_length=4, pad_id=0).batch
  assert np.all(packed.token_versions == 0)
  # Checkpoints from before per-token versions: one version per sample, for every token.
  data = json.loads(json.dumps(dataclasses.asdict(groups[0])))
  data["versions"] = [5, 6, 7]
  assert Group.from_json(data).versions == [[5], [6, 6], [7, 7, 7]]


def test_partial_rollout_tokens_keep_the_version_that_sampled_them():
  """A sample whose weights were swapped mid-generation (partial rollouts): the first
  token by version 7, the rest by 8, row by row into the batch."""
  sampler = VersionedSampler((7, 8), token_versions=lambda n: [7] + [8] * (n - 1))
  generator = GroupGenerator(sampler, FakeScorer(), PromptFormat(FakeTokenizer(), prompt_length=8),
                             sampling=SamplingParams(n=3), seed=0)
  groups = generator.generate_groups([Example("ab", "1", "arith")])
  assert groups[0].versions == [[7], [7, 8], [7, 8, 8]] and groups[0].version == 7
  batch = pack_groups(groups, prompt_length=8, response_length=4, pad_id=0).batch
  mask = np.asarray(batch.response_mask) > 0
  expected = np.zeros_like(np.asarray(batch.token_versions))
  for row, versions in enumerate(groups[0].versions):
    expected[row, np.nonzero(mask[row])[0]] = versions
  np.testing.assert_array_equal(batch.token_versions, expected)
  broken = VersionedSampler((7, 8), token_versions=lambda n: [7] * (n + 1))
  generator.sampler = broken
  with pytest.raises(ValueError, match="token versions for"):
    generator.generate_groups([Example("ab", "1", "arith")])


def test_window_rows_carry_one_version_per_window():
  pool = windowed.WindowPool(2, group_size=2, window_tokens=2, max_new_tokens=6,
                             stop_token_ids=(0,))
  pool.fill(lambda n: [(Example("q", "1", "arith"), [9])] * n)
  pool.advance([([3, 4], [-1.0, -1.0]), ([5, 6], [-1.0, -1.0])], versions=[3, 3])
  segments = pool.advance([([7, 8], [-1.0, -1.0]), ([9], [-1.0])], versions=[4, 4])
  assert [s.trajectory.versions for s in segments] == [[3, 3, 4, 4], [3, 3, 4]]
  copy = windowed.WindowPool(2, group_size=2, window_tokens=2, max_new_tokens=6,
                             stop_token_ids=(0,))
  copy.restore(json.loads(json.dumps(pool.state())))
  assert [t.versions for t in copy.in_flight] == [[3, 3, 4, 4], [3, 3, 4]]
  old_state = json.loads(json.dumps(pool.state()))
  for t in old_state["in_flight"]:
    del t["versions"]
  copy.restore(old_state)  # saved before versions were kept: version 0
  assert [t.versions for t in copy.in_flight] == [[0] * 4, [0] * 3]
  with pytest.raises(ValueError, match="got 1 versions for 2 windows"):
    pool.advance([([1], [0.0]), ([1], [0.0])], versions=[1])
  # Per token (a window whose weights were swapped mid-window)
  segments = pool.advance([([5, 0], [-1.0, -1.0]), ([6], [-1.0])], versions=[[4, 5], [5]])
  assert [s.trajectory.versions for s in segments] == [[3, 3, 4, 4, 4, 5], [3, 3, 4, 5]]
  with pytest.raises(ValueError, match="got 1 versions for 2 new tokens"):
    pool.advance([([1, 2], [0.0, 0.0])], versions=[[6]])


# ------------------------------------------------------------------ dynamic sampling


class Rounds:
  """A generator returning scripted rounds of groups."""

  def __init__(self, rounds):
    self.rounds = collections.deque(rounds)

  def generate_groups(self, examples):
    return self.rounds.popleft()

  def state(self):
    return {}

  def restore(self, state):
    pass


class Stream:
  def take(self, count):
    return [None] * count

  def set_step(self, step):
    pass

  def state(self):
    return {}

  def restore(self, state):
    pass


def dynamic(rounds, **options):
  return DynamicSamplingRollout(Rounds(rounds), Stream(), prompts_per_step=2,
                                response_length=4, oversample=3, max_rounds=10, **options)


def test_dynamic_sampling_discards_the_surplus_by_default():
  """verl's recipe: the step trains on the first qualified groups; the rest are dropped,
  so the next step samples all of its groups with its own policy."""
  first = [group(MIXED, 0) for _ in range(3)]
  rollout = dynamic([[group(SOLVED, 0)] + first])
  rollout.set_step(0)
  kept, metrics = rollout.next_groups()
  assert kept == first[:2] and not rollout.buffer
  assert metrics["discarded_surplus_groups"] == 1 and metrics["buffered_groups"] == 0
  second = [group(MIXED, 1), group(MIXED, 1)]
  rollout.generator.rounds.append(second)
  rollout.set_step(1)
  kept, metrics = rollout.next_groups()
  assert kept == second and metrics["reused_groups"] == 0 and metrics["generation_rounds"] == 1


def test_keep_surplus_serves_the_buffer_and_drops_groups_older_than_max_age():
  step0 = [group(MIXED, 0) for _ in range(5)]
  rollout = dynamic([step0], keep_surplus=True, max_age=1)
  rollout.set_step(0)
  kept, metrics = rollout.next_groups()
  assert kept == step0[:2] and list(rollout.buffer) == step0[2:]
  assert metrics["discarded_surplus_groups"] == 0 and metrics["buffered_groups"] == 3
  rollout.set_step(1)  # served from the buffer: one version old
  kept, metrics = rollout.next_groups()
  assert kept == step0[2:4] and metrics["generation_rounds"] == 0
  assert metrics["reused_groups"] == 2 and metrics["reused_group_age_mean"] == 1
  step2 = [group(MIXED, 2), group(MIXED, 2)]
  rollout.generator.rounds.append(step2)
  rollout.set_step(2)  # the last step-0 group is two versions old: dropped unused
  kept, metrics = rollout.next_groups()
  assert kept == step2 and metrics["expired_groups"] == 1 and not rollout.buffer


def test_buffer_state_keeps_the_versions():
  rollout = dynamic([[group(MIXED, 3) for _ in range(4)]], keep_surplus=True, max_age=2)
  rollout.set_step(3)
  rollout.next_groups()
  state = json.loads(json.dumps(rollout.state()))
  restored = dynamic([], keep_surplus=True, max_age=2)
  restored.restore(state)
  assert [g.versions for g in restored.buffer] == [[[3], [3]], [[3], [3]]]
  assert json.loads(json.dumps(restored.state())) == state
  restored.set_step(5)  # two versions later: still within max_age
  kept, metrics = restored.next_groups()
  assert [g.version for g in kept] == [3, 3] and metrics["reused_group_age_max"] == 2
  batch = pack_groups(kept, prompt_length=1, response_length=4, pad_id=0).batch
  assert np.all(batch.token_versions[np.asarray(batch.response_mask) > 0] == 3)
