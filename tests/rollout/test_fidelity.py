"""Fidelity of the rollout modes and of `prepare` to the formulas
(docs/formulas.md#notation, #ppo to #remax, #t-ppo).

* T-PPO's windows mode with a window W >= the response cap R is plain groups mode:
  every response finishes in its first window.
* `ppo_family.prepare` on a batch that mixes finished, cap-truncated and unfinished
  (T-PPO, still in flight) rows, against a NumPy reference written from the formulas.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.rewards import Scores
from rlhf_jax.rollout import GroupGenerator
from rlhf_jax.rollout import GroupRollout
from rlhf_jax.rollout import WindowRollout
from rlhf_jax.sampling import Completion
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.tasks import arith
from tests.training.runs import preset

# --------------------------------------------------------------------------------------
# 1. Windows mode with W >= R equals groups mode.
# --------------------------------------------------------------------------------------

VOCAB = 32  # the stand-in models' vocabulary; the fake sampler's tokens stay below it
PROMPTS_PER_STEP, GROUP, CAP = 2, 4, 6


class PlannedSampler:
  """A `Sampler` without a model, deterministic per sample.

  The k-th sample of prompt p within one `generate` call (k counts p's samples in call
  order, across requests: groups mode asks n = G of one request, windows mode G requests
  of n = 1) follows plan k mod 4 — stop early, run past any cap, stop exactly at `cap`,
  emit only the stop token — with tokens and log-probs drawn from a generator seeded by
  (p, k). It honours `max_new_tokens` and `stop_token_ids` as a real sampler does
  (finish_reason "length" at the cap without a stop token).

  It keys samples on (prompt, k), not on the request seed: the two modes draw seeds
  differently (groups one per call, spread over prompts by `prompt_seed`; windows one
  per response), so a real sampler gives equally distributed but different tokens.
  The seeds it was sent are kept in `seeds`.
  """

  def __init__(self, cap: int):
    self.cap = cap
    self.seeds: list[list[int]] = []
    self.budgets: list[int] = []

  def plan(self, prompt, k: int):
    rng = np.random.default_rng([*prompt, k])
    length = [int(rng.integers(2, self.cap)), self.cap + 5, self.cap, 1][k % 4]
    tokens = rng.integers(1, VOCAB, length - 1).tolist() + [None]  # None: the stop token
    if k % 4 == 1:
      tokens[-1] = int(rng.integers(1, VOCAB))  # no stop token at all
    return tokens, (-rng.uniform(0.05, 3.0, length)).tolist()

  def generate(self, prompts, sampling):
    params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
    assert len(params) == len(prompts)
    seen = collections.Counter()
    out = []
    for prompt, s in zip(prompts, params):
      self.seeds.append([s.seed] * s.n)
      self.budgets.append(s.max_new_tokens)
      samples = []
      for index in range(s.n):
        k = seen[tuple(prompt)]
        seen[tuple(prompt)] += 1
        planned, logprobs = self.plan(prompt, k)
        stop = s.stop_token_ids[0]
        planned = [stop if t is None else t for t in planned]
        tokens, reason = [], "length"
        for token in planned[:s.max_new_tokens]:
          tokens.append(token)
          if token in s.stop_token_ids:
            reason = "stop"
            break
        samples.append(Completion(
            request_id=str(len(self.budgets)), sample_index=index, prompt_ids=list(prompt),
            token_ids=tokens, sampled_logprobs=logprobs[:len(tokens)],
            model_logprobs=logprobs[:len(tokens)], finish_reason=reason, seed=s.seed,
            weights_version=(0, 0)))
      out.append(samples)
    return out


class ParityScorer:
  """Correct (+1) iff the decoded response has an odd number of characters, else −1;
  records what it scored."""

  def __init__(self):
    self.calls = []

  def score(self, examples, responses):
    self.calls.append(list(responses))
    correct = [len(r) % 2 == 1 for r in responses]
    return Scores(scores=[1.0 if c else -1.0 for c in correct], correct=correct,
                  failures=[""] * len(responses))


def make_rollout(mode: str, window: int = 0):
  """A GroupRollout or WindowRollout over the same prompts, seed, sampler and scorer."""
  tokenizer = arith.tokenizer()
  examples = [Example(f"{a}+{b}=", str(a + b), "arith")
              for a, b in [(12, 3), (4, 55), (7, 7), (31, 2), (9, 40), (6, 13)]]
  generator = GroupGenerator(
      PlannedSampler(CAP), ParityScorer(), PromptFormat(tokenizer, prompt_length=8),
      sampling=SamplingParams(max_new_tokens=CAP, stop_token_ids=(tokenizer.eos_id,),
                              n=GROUP),
      seed=7)
  stream = PromptStream(examples, seed=3)
  if mode == "groups":
    return GroupRollout(generator, stream, prompts_per_step=PROMPTS_PER_STEP,
                        response_length=CAP)
  return WindowRollout(generator, stream, prompts_per_step=PROMPTS_PER_STEP,
                       group_size=GROUP, window_tokens=window, response_length=CAP)


@pytest.fixture(scope="module")
def prepare_with_stand_ins():
  """One jitted prepare with T-PPO's algorithm (Extended GAE with a critic), π_old and
  values from stand-ins that read a row as the models do: a bigram policy (log-softmax
  of a random table's row for the previous token) and a critic summing random token
  embeddings over the real tokens so far. Not the decoder: its first initialisation in a
  process takes seconds, and equal batches give equal outputs from either."""
  rng = np.random.default_rng(5)
  table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)), jnp.float32)
  embedding = jnp.asarray(rng.normal(size=VOCAB), jnp.float32)
  algorithm = preset("tppo").algorithm

  @jax.jit
  def prepare(batch):
    cap, mask = batch.response_length, batch.response_mask
    logprobs = jax.nn.log_softmax(table[batch.tokens[:, -cap - 1:-1]], axis=-1)
    old = jnp.take_along_axis(logprobs, batch.response_tokens[..., None], axis=-1)[..., 0]
    seen = jnp.cumsum(embedding[batch.tokens] * batch.attention_mask, axis=1)
    values = jnp.tanh(seen[:, -cap - 1:-1])
    prepared, _, _ = ppo_family.prepare(
        algorithm, batch, old_logprobs=old * mask, ref_logprobs=None, values=values * mask,
        kl_coef=jnp.float32(0.0), correction="none", group_size=GROUP)
    return prepared

  return prepare


@pytest.mark.parametrize("window", [CAP, CAP + 3])
def test_windows_at_least_the_cap_give_the_groups_batch(window, prepare_with_stand_ins):
  groups, windows = make_rollout("groups"), make_rollout("windows", window)
  for step in range(2):
    plain, windowed = groups.collect(), windows.collect()
    a, b = plain.batch, windowed.batch
    # The fake sampler must exercise every ending: stop early, cap without a stop
    # token (truncated), stop token exactly at the cap (not truncated), stop token alone.
    assert set(a.lengths.tolist()) >= {1, CAP} and a.truncated.any() and not a.truncated.all()
    assert (~a.truncated & (a.lengths == CAP)).any()  # the stop token exactly at the cap
    # Each window's budget is min(W, R − 0) = R, the groups request's max_new_tokens.
    assert set(windows.generator.sampler.budgets) == {CAP}
    # Every response finishes in its first window: the pool is empty after each step.
    assert not windows.pool.in_flight and not windows.pool.waiting
    np.testing.assert_array_equal(b.window_starts, 0)
    np.testing.assert_array_equal(b.finished, True)
    for field in dataclasses.fields(batch_lib.RolloutBatch):
      x, y = np.asarray(getattr(a, field.name)), np.asarray(getattr(b, field.name))
      assert x.dtype == y.dtype and x.shape == y.shape, field.name
      if field.name == "group_ids":
        # Legitimately different bookkeeping: groups mode numbers a step's groups from 0,
        # the window pool counts every group it ever started. Same partition of the rows.
        np.testing.assert_array_equal(y, x + step * PROMPTS_PER_STEP)
        np.testing.assert_array_equal(x, np.repeat(np.arange(PROMPTS_PER_STEP), GROUP))
      else:
        np.testing.assert_array_equal(y, x, err_msg=field.name)
    assert windowed.correct == plain.correct and windowed.failures == plain.failures
    # The modes' own metrics (groups mode has none).
    assert plain.metrics == {}
    rows = float(PROMPTS_PER_STEP * GROUP)
    assert windowed.metrics == {"finished_responses": rows, "started_responses": rows,
                                "in_flight_responses": 0.0}
    # Both scored the same decoded responses.
    assert windows.generator.scorer.calls[-1] == groups.generator.scorer.calls[-1]
    # The prepared batches (π_old, values, Extended-GAE advantages and returns) agree.
    pa = prepare_with_stand_ins(batch_lib.as_device(a))
    pb = prepare_with_stand_ins(batch_lib.as_device(b))
    assert np.abs(np.asarray(pa.advantages)).max() > 0
    for name in ("old_logprobs", "values", "advantages", "returns", "is_weights",
                 "correction_mask", "response_mask"):
      np.testing.assert_array_equal(getattr(pb, name), getattr(pa, name), err_msg=name)
    for name in ("policy_mask", "value_mask", "sampled_mask"):
      np.testing.assert_array_equal(getattr(pb, name)(), getattr(pa, name)(), err_msg=name)
  # The seeds differ by design (see PlannedSampler): one per call vs one per response.
  assert [len(s) for s in groups.generator.sampler.seeds] == [GROUP] * 4
  assert [len(s) for s in windows.generator.sampler.seeds] == [1] * (4 * GROUP)


# --------------------------------------------------------------------------------------
# 2. `prepare` on finished, truncated and unfinished rows against NumPy.
# --------------------------------------------------------------------------------------

R, W = 10, 4  # response cap and T-PPO window
# One row per case: (length so far, window start, finished, truncated, score). Unfinished
# rows are T-PPO responses still in flight (WindowRollout scores them 0, unscored); the
# window starts are where this step's window began (multiples of W).
ROWS = [
    (3, 0, True, False, 1.0),     # stopped in its first window
    (8, 4, False, False, 0.0),    # second window done, continues next step
    (10, 8, True, True, -1.0),    # third window cut to the cap: truncated
    (6, 4, True, False, -1.0),    # stopped in its second window
    (4, 0, False, False, 0.0),    # first window done, continues
    (9, 8, True, False, 1.0),     # stopped in its third window
    (1, 0, True, False, -1.0),    # the stop token alone
    (8, 4, False, False, 0.0),    # continues
]


def mixed_batch(rows, seed=0, scored=None):
  """(batch, trainer log-probs, reference log-probs, values) for `rows`: random tokens,
  sampler log-probs, and trainer / reference log-probs that differ from them by noise;
  `scored` False marks rows no reward scored (reward.unscored='drop')."""
  rng = np.random.default_rng(seed)
  lengths = [r[0] for r in rows]
  sampler = [list(-rng.uniform(0.1, 3.0, n)) for n in lengths]
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, VOCAB, 3)) for _ in rows],
      [list(rng.integers(1, VOCAB, n)) for n in lengths], sampler,
      [r[4] for r in rows], [r[3] for r in rows], [i // 4 for i in range(len(rows))],
      prompt_length=3, response_length=R, pad_id=0, window_starts=[r[1] for r in rows],
      finished=[r[2] for r in rows], scored=scored)
  mask = batch.response_mask
  trainer = (batch.sampler_logprobs + rng.normal(0, 0.5, mask.shape)) * mask
  reference = (batch.sampler_logprobs + rng.normal(0, 0.5, mask.shape)) * mask
  values = rng.normal(0, 1, mask.shape) * mask
  return batch, *(x.astype(np.float32) for x in (trainer, reference, values))


def np_kl(logp, ref, estimator):
  delta = logp.astype(np.float64) - ref
  if estimator == "k1":
    return delta
  assert estimator == "k3"
  return np.exp(-delta) - 1 + delta


def np_gae(rewards, values, mask, finished, *, gamma, lam):
  """GAE per row, backwards over its valid tokens (docs/formulas.md#notation):
  δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}. After the last token V is 0 for a
  finished row and V(s_l) := V(s_{l−1}) for an unfinished one (T-PPO's EGAE,
  docs/formulas.md#t-ppo)."""
  advantages = np.zeros(rewards.shape)
  for i in range(rewards.shape[0]):
    valid = np.flatnonzero(mask[i])
    if not len(valid):
      continue
    next_value = 0.0 if finished[i] else values[i, valid[-1]]
    running = 0.0
    for t in valid[::-1]:
      delta = rewards[i, t] + gamma * next_value - values[i, t]
      running = delta + gamma * lam[i] * running
      advantages[i, t] = running
      next_value = values[i, t]
  return advantages


def np_whiten(x, mask):
  """(x − μ) / sqrt(σ² + 1e-8) over the masked entries (Bessel σ²,
  docs/formulas.md#notation)."""
  chosen = x[mask > 0]
  return (x - chosen.mean()) / np.sqrt(chosen.var(ddof=1) + 1e-8) * mask


def np_prepare(a, batch, trainer, reference, values, *, beta, correction, group_size):
  """The reference of `prepare`: masks, token rewards, advantages and returns."""
  n, cap = batch.response_mask.shape
  lengths = batch.lengths.astype(np.float64)
  finished, truncated = batch.finished, batch.truncated
  mask = batch.response_mask.astype(np.float64)
  scores = batch.scores.astype(np.float64)
  # DAPO's shaping (Eq. 13): the soft overlong penalty on finished responses only (an
  # unfinished one has no final length yet), the filter drops truncated rows.
  if a.overlong.penalty:
    expected = cap - a.overlong.buffer
    penalty = np.minimum(-(lengths - expected) / a.overlong.buffer * a.overlong.factor, 0.0)
    scores = scores + penalty * finished
  if a.overlong.filter:
    mask = mask * ~truncated[:, None]
  mask = mask * batch.scored[:, None]  # rows no reward scored leave the loss
  columns = np.arange(cap)[None, :]
  sampled = mask * (columns >= batch.window_starts[:, None])
  # Rollout correction on this window's tokens: r = π_trainer / π_sampler.
  ratio = np.exp(trainer.astype(np.float64) - batch.sampler_logprobs)
  threshold = a.correction.threshold
  if correction == "none":
    keep, weights = sampled, sampled
  elif correction == "tis":
    keep, weights = sampled, np.minimum(ratio, threshold) * sampled
  else:
    assert correction == "mis_token"
    keep = sampled * ((ratio >= 1 / threshold) & (ratio <= threshold))
    weights = ratio * keep
  # π_old: the trainer's own forward under a correction, the sampler's without one.
  old = trainer * mask if correction != "none" else batch.sampler_logprobs
  out = dict(response_mask=mask, sampled_mask=sampled, correction_mask=keep,
             is_weights=weights, policy_mask=sampled * keep,
             value_mask=mask * finished[:, None], old_logprobs=old)
  # Token rewards: the score at the last valid token, minus β·KL(π_old‖π_ref) per token.
  rewards = np.zeros((n, cap))
  for i in range(n):
    valid = np.flatnonzero(mask[i])
    if len(valid):
      rewards[i, valid[-1]] = scores[i]
  if a.kl.placement == "reward":
    rewards = rewards - beta * np_kl(old, reference, a.kl.estimator) * mask
  v = a.advantage
  if v.estimator == "gae":
    if v.lam_schedule == "length_adaptive":  # VAPO: λ = 1 − 1/(α·l), clamped to [0, 1)
      actor_lam = np.clip(1 - 1 / (v.length_adaptive_alpha * lengths), 0, 1 - 1e-7)
    else:
      actor_lam = np.full(n, v.actor_lam)
    advantages = np_gae(rewards, values, mask, finished, gamma=v.gamma, lam=actor_lam)
    returns = (np_gae(rewards, values, mask, finished, gamma=v.gamma,
                      lam=np.full(n, v.critic_lam)) + values) * mask
  else:
    assert v.estimator == "grpo"
    # Each group's statistics over the rows a reward scored (all, unless dropped).
    normalised = np.zeros(n)
    for start in range(0, n, group_size):
      rows = [i for i in range(start, start + group_size) if batch.scored[i]]
      if len(rows) > 1:
        members = scores[rows]
        normalised[rows] = (members - members.mean()) / (members.std(ddof=1) + 1e-6)
    advantages = normalised[:, None] * mask
    returns = np.zeros((n, cap))
  advantages = np_whiten(advantages, out["policy_mask"]) if v.whiten else advantages * mask
  out.update(advantages=advantages, returns=returns, token_rewards=rewards)
  return out


def gae_algorithm():
  """Critic GAE with γ < 1, λ_actor < λ_critic < 1, whitening, a k3 KL in the reward and
  DAPO's overlong penalty (which must spare unfinished rows)."""
  a = ppo_config.algorithm_config()
  a.advantage.estimator = "gae"
  a.advantage.gamma, a.advantage.actor_lam, a.advantage.critic_lam = 0.9, 0.7, 0.95
  a.advantage.whiten = True
  a.kl.placement, a.kl.estimator, a.kl.coef = "reward", "k3", 0.1
  a.overlong.penalty, a.overlong.buffer = True, 4
  a.correction.threshold = 1.5
  return a


def tppo_algorithm():
  """The T-PPO preset as is: γ = 1, λ_actor 0.95, λ_critic 1, no KL, no whitening."""
  return preset("tppo").algorithm


def vapo_gae_algorithm():
  """VAPO's length-adaptive λ_actor (α = 0.5: λ from 0 at l = 2 to 0.8 at l = 10)."""
  a = preset("vapo").algorithm
  a.advantage.length_adaptive_alpha = 0.5
  return a


def grpo_algorithm():
  """GRPO with DAPO's overlong penalty and filter."""
  a = preset("grpo").algorithm
  a.overlong.penalty, a.overlong.filter, a.overlong.buffer = True, True, 4
  return a


# Group estimators only ever see whole responses (rollout.mode 'windows' needs a critic,
# `rollout.config` validation), so the GRPO case has finished and cap-truncated rows only.
GRPO_ROWS = [(length, 0, True, length == R, score) for length, _, _, _, score in ROWS]
GRPO_ROWS[1] = (R, 0, True, True, 1.0)
GRPO_ROWS[4] = (7, 0, True, False, 1.0)
GRPO_ROWS[7] = (R, 0, True, False, -1.0)  # the stop token exactly at the cap


# Rows no reward function scored (reward.unscored='drop'): one in the first group, three
# of the second (one member left: no baseline).
DROPPED = [True, False, True, True, False, True, False, False]


@pytest.mark.parametrize("make_algorithm,rows,correction,scored", [
    (gae_algorithm, ROWS, "mis_token", None),
    (gae_algorithm, ROWS, "none", None),
    (tppo_algorithm, ROWS, "none", None),
    (vapo_gae_algorithm, ROWS, "tis", None),
    (grpo_algorithm, GRPO_ROWS, "none", None),
    (grpo_algorithm, GRPO_ROWS, "none", DROPPED),
], ids=["gae-kl-whiten-mis", "gae-kl-whiten", "tppo", "vapo-tis", "grpo-overlong",
        "grpo-dropped"])
def test_prepare_matches_numpy_on_mixed_rows(make_algorithm, rows, correction, scored):
  a = make_algorithm()
  batch, trainer, reference, values = mixed_batch(rows, scored=scored)
  beta = 0.1
  # Eager, not jitted: each case would compile its own program, while eager op-by-op
  # dispatch reuses the primitives the first case compiled (several seconds saved).
  got, next_beta, metrics = ppo_family.prepare(
      a, batch_lib.as_device(batch), old_logprobs=jnp.asarray(trainer),
      ref_logprobs=jnp.asarray(reference) if a.kl.placement != "none" else None,
      values=jnp.asarray(values) if a.advantage.estimator == "gae" else None,
      kl_coef=jnp.float32(beta), correction=correction, group_size=4)
  expected = np_prepare(a, batch, trainer, reference, values, beta=beta,
                        correction=correction, group_size=4)
  for name in ("response_mask", "correction_mask"):
    np.testing.assert_array_equal(getattr(got, name), expected[name], err_msg=name)
  for name in ("sampled_mask", "policy_mask", "value_mask"):
    np.testing.assert_array_equal(getattr(got, name)(), expected[name], err_msg=name)
  for name in ("is_weights", "old_logprobs"):
    np.testing.assert_allclose(getattr(got, name), expected[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  np.testing.assert_allclose(ppo_family.token_rewards(a, got, beta), expected["token_rewards"],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got.advantages, expected["advantages"], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got.returns, expected["returns"], rtol=1e-4, atol=1e-5)
  # Properties that hold whatever the reference says.
  finished = batch.finished
  in_flight = np.flatnonzero(~finished)
  unfinished_last = (in_flight, batch.lengths[in_flight] - 1)
  if a.advantage.estimator == "gae":
    # The critic learns from finished rows only; this window's tokens carry the gradient.
    assert expected["value_mask"][~finished].sum() == 0 and expected["value_mask"].sum() > 0
    if a.overlong.penalty:
      # An unfinished row keeps its 0 score (no overlong penalty before it ends).
      np.testing.assert_array_equal(np.asarray(got.scores)[~finished], 0.0)
  if a.advantage.gamma == 1.0 and a.kl.placement == "none":
    # EGAE: with γ = 1 and no token reward the last δ of an unfinished row is
    # V(s_{l−1}) − V(s_{l−1}) = 0 ...
    np.testing.assert_array_equal(np.asarray(got.advantages)[unfinished_last], 0.0)
    if a.advantage.critic_lam == 1.0:
      # ... and a finished row's λ = 1 critic target is its Monte-Carlo return: the score.
      returns = np.asarray(got.returns)
      for i in np.flatnonzero(finished):
        np.testing.assert_allclose(returns[i, :batch.lengths[i]], batch.scores[i],
                                   rtol=1e-5, atol=1e-5)
  if a.advantage.estimator == "grpo":
    # Truncated rows count in their group's baseline but leave the loss (overlong filter);
    # dropped rows leave both.
    assert np.all(np.asarray(got.advantages)[batch.truncated | ~batch.scored] == 0)
    assert np.all(np.asarray(got.response_mask)[~batch.scored] == 0)
    assert np.abs(np.asarray(got.advantages)[~batch.truncated]).sum() > 0
  if a.kl.placement == "reward":
    assert float(next_beta) == np.float32(beta) and "rollout_kl" in metrics  # fixed β
