"""The estimator and policy-loss tables (algorithms/estimators.py, algorithms/losses.py):
the built-ins against NumPy, registered and "module:name" entries used by
`ppo_family`, their capabilities read by validation, and one-line errors naming the field
for paths that cannot be used."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import kernels
from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import losses
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config
from tests.algorithms import registry_plugins

PLUGINS = "tests.algorithms.registry_plugins"
G = 4


@pytest.fixture(autouse=True)
def fresh_tables():
  """What a test registers leaves with it (the tables are module-global)."""
  before = {table: set(table) for table in (estimators.ESTIMATORS, losses.POLICY_LOSSES)}
  yield
  for table, names in before.items():
    for name in set(table) - names:
      table.unregister(name)


def rollouts(rows=8, response_length=6, seed=0):
  """Ragged whole responses in groups of G, scores in {0, 0.3, 1}, critic values,
  π_θ near π_old, correction weights and a reference."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response_length + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [[1, 2]] * rows, [[3] * n for n in lengths],
      [list(-rng.uniform(0.1, 2.0, n)) for n in lengths],
      list(rng.choice([0.0, 0.3, 1.0], rows)), [False] * rows, [i // G for i in range(rows)],
      prompt_length=2, response_length=response_length, pad_id=0)
  batch = batch_lib.as_device(batch)
  mask = np.asarray(batch.response_mask)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  batch = batch.replace(values=f32(rng.uniform(-1, 1, mask.shape) * mask),
                        is_weights=f32(rng.uniform(0.5, 1.5, mask.shape) * mask),
                        ref_logprobs=f32(-rng.uniform(0.1, 2.0, mask.shape) * mask))
  logprobs = f32(batch.old_logprobs + rng.uniform(-0.4, 0.4, mask.shape) * mask)
  return batch, logprobs


def algorithm(estimator="grpo", kind="ppo"):
  a = ppo_config.algorithm_config()
  a.advantage.estimator, a.policy_loss.kind = estimator, kind
  a.advantage.gamma, a.advantage.actor_lam, a.advantage.critic_lam = 0.9, 0.8, 1.0
  a.policy_loss.agg = "seq-mean-token-mean"
  return a


def advantages(a, batch):
  return ppo_family.advantages_and_returns(a, batch, 0.0, group_size=G)


# NumPy references (the papers' formulas), per row r of [B, R] arrays with mask m.

def np_gae(rewards, values, mask, gamma, lam):
  out = np.zeros_like(rewards)
  for r in range(rewards.shape[0]):
    n, running = int(mask[r].sum()), 0.0
    for t in reversed(range(n)):
      next_value = values[r, t + 1] if t + 1 < n else 0.0  # finished: no successor
      running = rewards[r, t] + gamma * next_value - values[r, t] + gamma * lam * running
      out[r, t] = running
  return out


def np_whiten(x, mask):
  valid = x[mask > 0]
  return (x - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8) * mask


def np_reference(name, batch, gamma=0.9, lam=0.8):
  mask, s = np.asarray(batch.response_mask), np.asarray(batch.scores, np.float64)
  grouped = s.reshape(-1, G)
  centred = (grouped - grouped.mean(1, keepdims=True)).reshape(-1)
  rewards = np.zeros(mask.shape)
  rewards[np.arange(len(s)), mask.sum(1).astype(int) - 1] = s
  if name == "gae":
    values = np.asarray(batch.values, np.float64)
    return np_gae(rewards, values, mask, gamma, lam), (
        np_gae(rewards, values, mask, gamma, 1.0) + values) * mask
  if name == "reinforce_pp":
    returns = np.zeros_like(rewards)
    for t in reversed(range(mask.shape[1])):
      later = returns[:, t + 1] if t + 1 < mask.shape[1] else 0.0
      returns[:, t] = (rewards[:, t] + gamma * later) * mask[:, t]
    return np_whiten(returns, mask), None
  per_row = {
      "grpo": centred / (grouped.std(1, ddof=1, keepdims=True).repeat(G) + 1e-6),
      "dr_grpo": centred,
      "rloo": G / (G - 1) * centred,
      "reinforce_pp_baseline": centred,
  }[name]
  out = per_row[:, None] * mask
  return (np_whiten(out, mask) if name == "reinforce_pp_baseline" else out), None


@pytest.mark.parametrize("name", estimators.BUILT_IN)
def test_built_in_estimators_equal_numpy_references(name):
  batch, _ = rollouts()
  got, returns = advantages(algorithm(name), batch)
  expected, expected_returns = np_reference(name, batch)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  if expected_returns is None:
    assert not np.any(np.asarray(returns))
  else:
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-6)
  assert ppo_config.uses_critic(algorithm(name)) == (name == "gae")


def test_a_registered_estimator_is_used_and_its_capabilities_read():
  def squared(batch, token_rewards, a, *, group_size):
    del token_rewards, a, group_size
    return batch.scores[:, None] ** 2 * batch.response_mask, None

  estimators.register_estimator("test_squared", squared, needs_reference=True)
  batch, _ = rollouts()
  mask, s = np.asarray(batch.response_mask), np.asarray(batch.scores)
  a = algorithm("test_squared")
  got, returns = advantages(a, batch)
  np.testing.assert_allclose(got, s[:, None] ** 2 * mask, rtol=1e-6)
  assert not np.any(np.asarray(returns))
  a.advantage.whiten = True  # whitening stays the dispatcher's, for every estimator
  np.testing.assert_allclose(advantages(a, batch)[0], np_whiten(s[:, None] ** 2 * mask, mask),
                             rtol=1e-5, atol=1e-6)
  assert a.kl.placement == "none" and ppo_config.uses_reference(a)  # needs_reference
  assert not ppo_config.uses_critic(a)
  assert "test_squared" in estimators.names()


def test_module_estimators_are_used():
  batch, _ = rollouts()
  mask, s = np.asarray(batch.response_mask), np.asarray(batch.scores)
  got, _ = advantages(algorithm(f"{PLUGINS}:score_minus_half"), batch)
  np.testing.assert_allclose(got, (s - 0.5)[:, None] * mask, rtol=1e-6)
  got, _ = advantages(algorithm(f"{PLUGINS}:GROUP_MAX_GAP"), batch)  # an Estimator record
  grouped = s.reshape(-1, G)
  gap = (grouped - grouped.max(1, keepdims=True)).reshape(-1)
  np.testing.assert_allclose(got, gap[:, None] * mask, rtol=1e-6)


def test_a_module_estimator_s_capabilities_are_validated():
  config = base_config("arith")
  config.algorithm.advantage.estimator = f"{PLUGINS}:GROUP_MAX_GAP"
  validate_config(config, num_devices=1)
  config.rollout.group_size = 1
  with pytest.raises(ConfigError, match=r"^config\.rollout\.group_size: invalid value 1: must "
                     r"be >= 2 for algorithm\.advantage\.estimator='tests\.algorithms"):
    validate_config(config, num_devices=1)
  config.rollout.group_size = 2
  config.algorithm.policy_loss.kind = "gspo"  # one advantage per response: still fine
  config.algorithm.policy_loss.clip_low = config.algorithm.policy_loss.clip_high = 3e-4
  validate_config(config, num_devices=1)


def actor(a, batch, logprobs):
  entropy = jnp.ones_like(logprobs)
  fn = lambda lp: ppo_family.actor_loss(a, lp, entropy, batch,
                                        ppo_family.normalizers(a, batch))
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logprobs)
  return loss, metrics, grad


def test_a_module_loss_equal_to_ppo_reproduces_ppo_exactly():
  batch, logprobs = rollouts(seed=1)
  batch = batch.replace(advantages=advantages(algorithm("grpo"), batch)[0])
  runs = {}
  for kind in ("ppo", f"{PLUGINS}:ppo_copy"):
    a = algorithm(kind=kind)
    a.kl.placement, a.kl.coef, a.policy_loss.entropy_coef = "loss", 0.05, 0.01
    runs[kind] = actor(a, batch, logprobs)
  (loss, metrics, grad), (copy_loss, copy_metrics, copy_grad) = runs.values()
  np.testing.assert_array_equal(copy_loss, loss)
  np.testing.assert_array_equal(copy_grad, grad)
  assert {k: float(v) for k, v in copy_metrics.items()} == {
      k: float(v) for k, v in metrics.items()}


def test_a_module_loss_that_differs_changes_the_loss():
  batch, logprobs = rollouts(seed=2)
  batch = batch.replace(advantages=advantages(algorithm("grpo"), batch)[0])
  ppo_loss, _, _ = actor(algorithm(kind="ppo"), batch, logprobs)
  loss, metrics, grad = actor(algorithm(kind=f"{PLUGINS}:unclipped"), batch, logprobs)
  # −(1/B) Σ_i (1/|o_i|) Σ_t w·A·π_θ/π_old, by hand.
  m, w, adv = (np.asarray(x, np.float64) for x in (batch.policy_mask(), batch.is_weights,
                                                  batch.advantages))
  ratio = np.exp(np.asarray(logprobs, np.float64) - np.asarray(batch.old_logprobs))
  expected = np.mean(np.sum(-w * adv * ratio * m, 1) / np.sum(m, 1))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(metrics["pg_loss"], expected, rtol=1e-5)
  assert abs(float(loss) - float(ppo_loss)) > 1e-3  # the ratios leave PPO's clip range
  np.testing.assert_allclose(metrics["plugin/advantage_mean"], np.sum(adv * m) / np.sum(m),
                             rtol=1e-5)
  np.testing.assert_allclose(grad, -w * adv * ratio * m / np.sum(m, 1, keepdims=True)
                             / m.shape[0], rtol=1e-4, atol=1e-7)


def test_a_registered_loss_is_used_and_its_capabilities_read():
  losses.register_policy_loss("test_unclipped_seq", registry_plugins.unclipped,
                              sequence_advantages=True)
  batch, logprobs = rollouts(seed=2)
  batch = batch.replace(advantages=advantages(algorithm("grpo"), batch)[0])
  module, _, _ = actor(algorithm(kind=f"{PLUGINS}:unclipped"), batch, logprobs)
  registered, _, _ = actor(algorithm(kind="test_unclipped_seq"), batch, logprobs)
  np.testing.assert_array_equal(registered, module)
  config = base_config("arith")
  config.algorithm.policy_loss.kind = "test_unclipped_seq"
  validate_config(config, num_devices=1)
  config.algorithm.advantage.estimator = "gae"  # per-token advantages
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.policy_loss\.kind: invalid "
                     r"value 'test_unclipped_seq': must be one of ppo, gspo_token, cispo"):
    validate_config(config, num_devices=1)


@pytest.mark.parametrize("field,value,match", [
    ("advantage.estimator", "grpoo", r"must be one of gae, grpo, dr_grpo, rloo, reinforce_pp, "
     r"reinforce_pp_baseline.*or 'package\.module:name'"),
    ("advantage.estimator", "tests.algorithms.no_such_module:fn", r"its module does not "
     r"import: ModuleNotFoundError"),
    ("advantage.estimator", f"{PLUGINS}:absent", r"has no Estimator or function 'absent'"),
    ("advantage.estimator", f"{PLUGINS}:", r"must be 'package\.module:Estimator or function'"),
    ("advantage.estimator", f"{PLUGINS}:ppo_copy", r"its function must take \(batch, "
     r"token_rewards, algorithm, \*, group_size\)"),
    ("policy_loss.kind", "ppo2", r"must be one of ppo, gspo, gspo_token, cispo.*or "
     r"'package\.module:name'"),
    ("policy_loss.kind", "tests.algorithms.no_such_module:fn", r"its module does not import"),
    ("policy_loss.kind", f"{PLUGINS}:NOT_A_FUNCTION", r"has no PolicyLoss or function "
     r"'NOT_A_FUNCTION'"),
    ("policy_loss.kind", f"{PLUGINS}:too_few_arguments", r"its function must take "
     r"\(logprobs, old_logprobs, advantages, mask, \*, clip_low"),
    ("policy_loss.kind", f"{PLUGINS}:score_minus_half", r"its function must take"),
    ("policy_loss.dual_clip", 3.0, None),  # only a loss that reads it
])
def test_unusable_entries_are_one_line_errors_naming_the_field(field, value, match):
  config = base_config("arith")
  section, key = field.split(".")
  if key == "dual_clip":
    config.algorithm.policy_loss.kind = f"{PLUGINS}:ppo_copy"
    match = r"must be None with algorithm\.policy_loss\.kind='tests\.algorithms"
  config.algorithm[section][key] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config, num_devices=1)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"config.algorithm.{field}: invalid value {value!r}"), message
  assert error.value.field == f"algorithm.{field}"
  assert re.search(match, message), message


def test_registering_refuses_built_in_names_and_module_paths():
  with pytest.raises(ValueError, match="built-in"):
    estimators.register_estimator("gae", registry_plugins.score_minus_half)
  with pytest.raises(ValueError, match="built-in"):
    losses.register_policy_loss("ppo", registry_plugins.ppo_copy)
  with pytest.raises(ValueError, match="without ':'"):
    losses.register_policy_loss("a:b", registry_plugins.ppo_copy)
  with pytest.raises(ConfigError, match="must take"):
    losses.register_policy_loss("test_bad", registry_plugins.too_few_arguments)
