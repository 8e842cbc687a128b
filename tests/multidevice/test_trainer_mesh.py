"""The RL trainer on an 8-device mesh: same rollouts and updates as on one device."""

import json

import jax
import numpy as np
import pytest

from rlhf_jax import parallel
from tests.training.runs import preset
from tests.training.runs import make_trainer
from tests.training.runs import shrink


def run(tmp_path, name, mesh):
  config = shrink(preset("ppo"))  # actor, critic and reference: every sharded tree
  config.model.num_heads = 4
  kl = config.algorithm.kl
  kl.placement, kl.coef, kl.controller = "loss", 0.01, "fixed"
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  workdir = tmp_path / name
  trainer = make_trainer(config, workdir)
  trainer.run()
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return trainer, records


@pytest.mark.slow
def test_trainer_on_a_mesh_matches_one_device(tmp_path):
  single, expected = run(tmp_path, "one", (1, 1, 1))
  sharded, got = run(tmp_path, "mesh", (2, 4, 1))
  assert sharded.mesh.devices.size == 8 and single.mesh.devices.size == 1
  # Parameters and optimizer state keep the FSDP layout through the updates.
  actor = sharded.learner.actor
  wanted = parallel.param_shardings(actor.params, actor.model.logical_axes(), sharded.mesh)
  for leaf, sharding in zip(jax.tree.leaves(actor.params), jax.tree.leaves(wanted)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
  assert any(len(leaf.sharding.device_set) == 8 and not leaf.sharding.is_fully_replicated
             for leaf in jax.tree.leaves(actor.state.opt_state) if hasattr(leaf, "sharding"))
  # Same rollouts (the sampler draws from the same distribution with the same keys) and
  # the same losses up to float32 reduction order.
  for key in ("reward_mean", "response_length_mean", "accuracy"):
    assert [r.get(key) for r in got] == [r.get(key) for r in expected], key
  for key in ("loss", "pg_loss", "kl_loss", "value_loss", "entropy", "grad_norm",
              "critic_loss"):
    np.testing.assert_allclose([r[key] for r in got[1:]], [r[key] for r in expected[1:]],
                               rtol=2e-4, atol=1e-5, err_msg=key)
  assert got[1]["logprob_mismatch_max"] < 1e-4
  for a, b in zip(jax.tree.leaves(actor.params), jax.tree.leaves(single.learner.actor.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def run_offline_family(tmp_path, name, learner, mesh):
  """Iterative DPO, or DQO on the step's own samples (online reference): the same loop
  with another learner."""
  config = shrink(preset("iterative_dpo" if learner == "dpo" else "dqo"))
  config.model.num_heads = 4
  config.rollout.mode, config.rollout.group_size = "groups", 4
  config.algorithm[learner].reference = "online"
  config.train.minibatches = 1 if learner == "dpo" else 2
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  config.train.steps = config.train.eval_every = 1
  workdir = tmp_path / name
  trainer = make_trainer(config, workdir)
  trainer.run()
  return trainer, [json.loads(line) for line in open(workdir / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("learner, keys", [
    ("dpo", ("loss", "reward_margin", "chosen_logps", "dpo/pairs_with_preference")),
    ("dqo", ("loss", "critic_loss", "q_mean", "dqo/target_mean"))])
def test_dpo_and_dqo_learners_on_a_mesh_match_one_device(tmp_path, learner, keys):
  single, expected = run_offline_family(tmp_path, "one", learner, (1, 1, 1))
  sharded, got = run_offline_family(tmp_path, "mesh", learner, (2, 4, 1))
  assert sharded.mesh.devices.size == 8
  assert [r.get("reward_mean") for r in got] == [r.get("reward_mean") for r in expected]
  for key in keys:
    np.testing.assert_allclose([r.get(key, np.nan) for r in got[1:]],
                               [r.get(key, np.nan) for r in expected[1:]], rtol=2e-4,
                               atol=1e-5, err_msg=key)
  for a, b in zip(jax.tree.leaves(sharded.learner.actor.params),
                  jax.tree.leaves(single.learner.actor.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
