"""The estimator table (algorithms/estimators.py): the built-ins against NumPy, registered
and "module:name" estimators used by `ppo_family`, their capabilities read by validation,
and one-line errors naming the field for estimators that cannot be used."""

import re

import numpy as np
import pytest

from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

from tests.algorithms import registry_plugins
from tests.algorithms.ppo_batches import G
from tests.algorithms.ppo_batches import PLUGINS
from tests.algorithms.ppo_batches import advantages
from tests.algorithms.ppo_batches import algorithm
from tests.algorithms.ppo_batches import rollouts


@pytest.fixture(autouse=True)
def fresh_tables():
  """What a test registers leaves with it (the table is module-global)."""
  before = set(estimators.ESTIMATORS)
  yield
  for name in set(estimators.ESTIMATORS) - before:
    estimators.ESTIMATORS.unregister(name)


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


@pytest.mark.parametrize("value,match", [
    ("grpoo", r"must be one of gae, grpo, dr_grpo, rloo, reinforce_pp, "
     r"reinforce_pp_baseline.*or 'package\.module:name'"),
    ("tests.algorithms.no_such_module:fn", r"its module does not "
     r"import: ModuleNotFoundError"),
    (f"{PLUGINS}:absent", r"has no Estimator or function 'absent'"),
    (f"{PLUGINS}:", r"must be 'package\.module:Estimator or function'"),
    (f"{PLUGINS}:ppo_copy", r"its function must take \(batch, "
     r"token_rewards, algorithm, \*, group_size\)"),
])
def test_unusable_estimators_are_one_line_errors_naming_the_field(value, match):
  config = base_config("arith")
  config.algorithm.advantage.estimator = value
  with pytest.raises(ConfigError) as error:
    validate_config(config, num_devices=1)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"config.algorithm.advantage.estimator: invalid value {value!r}")
  assert error.value.field == "algorithm.advantage.estimator"
  assert re.search(match, message), message


def test_registering_refuses_built_in_names():
  with pytest.raises(ValueError, match="built-in"):
    estimators.register_estimator("gae", registry_plugins.score_minus_half)
