"""Q♯'s guide: the engine's logits hook gives exactly the distribution of the formula
π(a|s) ∝ π_ref(a|s)·exp(Q̂(s,a)/η) on π_ref's top-k (checked at every generated token
against an uncached forward), two-hot targets, and the guide's loss and fit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.algorithms import qsharp
from rlhf_jax.sampling import GuidedParams
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from tests.sampling.tiny_engine import BUCKETS
from tests.sampling.tiny_engine import CONFIG
from tests.sampling.tiny_engine import ENGINE
from tests.sampling.tiny_engine import prompts

MODEL, PARAMS = models.init_model(CONFIG, seed=5)
VALUES = np.array([0.0, 0.5, 1.0], np.float32)


def random_guide(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(0, 0.5, (CONFIG.hidden_size, CONFIG.vocab_size * 3)),
                           jnp.float32),
          "b": jnp.asarray(rng.normal(0, 1.0, (CONFIG.vocab_size * 3,)), jnp.float32)}


def formula_logprobs(guide, sequence, eta, top_k):
  """log π(·|s) after `sequence`, in NumPy from a plain forward's logits and hidden state."""
  logits, _, hidden = MODEL.apply(PARAMS, jnp.asarray([sequence]), with_hidden=True)
  logits = np.asarray(logits[0, -1], np.float64)
  hidden = np.asarray(hidden[0, -1], np.float64)
  log_ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
  bins = (hidden @ np.asarray(guide["w"], np.float64) + np.asarray(guide["b"])).reshape(-1, 3)
  p = np.exp(bins - bins.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  q_over_eta = np.log((p * np.exp(VALUES / eta)).sum(-1))  # log E_Z[exp(z/η)]
  keep = np.argsort(-log_ref, kind="stable")[:top_k]
  out = np.full_like(log_ref, -np.inf)
  out[keep] = log_ref[keep] + q_over_eta[keep]
  return out - np.log(np.exp(out[keep] - out[keep].max()).sum()) - out[keep].max(), keep


@pytest.mark.slow
def test_the_logits_hook_samples_the_guided_distribution(eta=0.5, top_k=5):
  guide = random_guide()
  hook = functools.partial(qsharp.guided_logits, values=VALUES, eta=eta, top_k=top_k)
  engine = sampling.Engine(MODEL, num_slots=4, cache_length=40, logits_hook=hook)
  sched = Scheduler(engine, GuidedParams(PARAMS, guide), prompt_buckets=BUCKETS)
  (prompt,) = prompts(1, seed=2)
  (samples,) = sched.generate([prompt], sampling.SamplingParams(n=3, max_new_tokens=6, seed=1))
  for sample in samples:
    for t, token in enumerate(sample.token_ids):
      expected, keep = formula_logprobs(guide, prompt + sample.token_ids[:t], eta, top_k)
      assert token in keep  # only π_ref's top-k are ever drawn
      assert sample.model_logprobs[t] == pytest.approx(expected[token], abs=2e-4)


def test_a_zero_guide_is_the_reference_restricted_to_its_top_k():
  hook = functools.partial(qsharp.guided_logits, values=VALUES, eta=0.2, top_k=CONFIG.vocab_size)
  guide = qsharp.init_guide(CONFIG.hidden_size, CONFIG.vocab_size, 3)
  plain = Scheduler(ENGINE, PARAMS, prompt_buckets=BUCKETS)  # the shared, compiled engine
  guided = Scheduler(sampling.Engine(MODEL, num_slots=2, cache_length=40, logits_hook=hook),
                     GuidedParams(PARAMS, guide), prompt_buckets=BUCKETS)
  request = sampling.SamplingParams(n=2, max_new_tokens=8, seed=4)
  a = plain.generate(prompts(1, seed=3), request)[0]
  b = guided.generate(prompts(1, seed=3), request)[0]
  assert [s.token_ids for s in a] == [s.token_ids for s in b]
  np.testing.assert_allclose([s.model_logprobs for s in a], [s.model_logprobs for s in b],
                             atol=1e-5)


def test_two_hot_targets_keep_the_expected_return():
  returns = jnp.asarray([0.0, 0.25, 0.5, 0.9, 1.0, 2.0, -1.0])
  targets = np.asarray(qsharp.two_hot(returns, VALUES))
  np.testing.assert_allclose(targets.sum(1), 1.0, atol=1e-6)
  np.testing.assert_allclose(targets @ VALUES, np.clip(returns, 0, 1), atol=1e-6)
  np.testing.assert_allclose(targets[1], [0.5, 0.5, 0.0], atol=1e-6)


def test_guide_loss_is_the_masked_cross_entropy_and_fitting_learns_the_returns():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(6, 4, CONFIG.hidden_size)).astype(np.float32)
  actions = rng.integers(0, CONFIG.vocab_size, (6, 4))
  returns = np.array([0.0, 1.0, 0.5, 1.0, 0.0, 0.25], np.float32)
  mask = (rng.uniform(size=(6, 4)) > 0.3).astype(np.float32)
  guide = random_guide(seed=1)
  loss = qsharp.guide_loss(guide, hidden, actions, returns, mask, values=VALUES)
  logits = (hidden @ np.asarray(guide["w"]) + np.asarray(guide["b"])).reshape(6, 4, -1, 3)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = np.asarray(qsharp.two_hot(jnp.asarray(returns), VALUES))
  ce = -np.einsum("nb,ntb->nt", target, np.take_along_axis(
      log_p, actions[:, :, None, None], axis=2)[:, :, 0])
  assert float(loss) == pytest.approx((ce * mask).sum() / mask.sum(), rel=1e-5)
  from rlhf_jax.algorithms.qsharp_fit import GuideData, fit_guide
  data = GuideData(hidden, actions, mask, returns)
  start = qsharp.init_guide(CONFIG.hidden_size, CONFIG.vocab_size, 3)
  fitted, losses = fit_guide(start, data, values=VALUES, steps=200, batch_size=6,
                             learning_rate=0.05, seed=0, log=lambda _: None)
  assert losses[-1] < losses[0] - 0.3
