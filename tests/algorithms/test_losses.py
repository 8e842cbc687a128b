"""The policy-loss table (algorithms/losses.py): registered and "module:name" losses used by
`ppo_family` (one equal to PPO reproduces it exactly), their capabilities read by
validation, and one-line errors naming the field for losses that cannot be used."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.algorithms import losses
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config
from tests.algorithms import registry_plugins

from tests.algorithms.ppo_batches import PLUGINS
from tests.algorithms.ppo_batches import advantages
from tests.algorithms.ppo_batches import algorithm
from tests.algorithms.ppo_batches import rollouts


@pytest.fixture(autouse=True)
def fresh_table():
  """What a test registers leaves with it (the table is module-global)."""
  before = set(losses.POLICY_LOSSES)
  yield
  for name in set(losses.POLICY_LOSSES) - before:
    losses.POLICY_LOSSES.unregister(name)


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
    losses.register_policy_loss("ppo", registry_plugins.ppo_copy)
  with pytest.raises(ValueError, match="without ':'"):
    losses.register_policy_loss("a:b", registry_plugins.ppo_copy)
  with pytest.raises(ConfigError, match="must take"):
    losses.register_policy_loss("test_bad", registry_plugins.too_few_arguments)
