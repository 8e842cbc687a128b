"""Trainer config validation, the rollout batch layout, and the PPO-family composition."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.algorithms import ppo_family
from rlhf_jax import batch as batch_lib
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset

PRESETS = ("ppo", "grpo", "dapo", "vcppo", "vapo", "tppo", "gspo", "cispo", "dpo",
           "iterative_dpo", "dqo", "toolcalc")


@pytest.mark.parametrize("name", PRESETS)
def test_presets_validate(name):
  validate_config(preset(name), num_devices=1)


@pytest.mark.parametrize("field,value,match", [
    ("algorithm.policy_loss.clip_high", 0.1, r"config\.algorithm\.policy_loss\.clip_high: "
     r"invalid value 0\.1: must be >= 0\.2 \(algorithm\.policy_loss\.clip_low\)"),
    ("algorithm.advantage.estimator", "ppo2", r"config\.algorithm\.advantage\.estimator: "
     r"invalid value 'ppo2': must be one of gae"),
    ("algorithm.policy_loss.agg", "mean",
     r"config\.algorithm\.policy_loss\.agg: invalid value 'mean': must be one of token-mean"),
    ("algorithm.value.pretrain_steps", 5, r"config\.algorithm\.value\.pretrain_steps: "
     r"invalid value 5: must be 0 without a critic"),
    ("rollout.mode", "windows", r"config\.rollout\.mode: invalid value 'windows': T-PPO's "
     "windows need a critic"),
    ("rollout.mode", "beam", r"config\.rollout\.mode: invalid value 'beam': must be one of "
     "groups, dynamic, windows, multi_turn, offline"),  # then any registered ones
    ("rollout.group_size", 1, r"config\.rollout\.group_size: invalid value 1: must be >= 2"),
    ("rollout.temperature", -1.0, r"config\.rollout\.temperature: invalid value -1\.0: "
     "must be >= 0"),
    ("train.minibatches", 7, r"config\.train\.minibatches: invalid value 7: must divide"),
    ("train.micro_batches", 3,
     r"config\.train\.micro_batches: invalid value 3: must divide the 64 rows"),
    ("sampler.cache_length", 100, r"config\.sampler\.cache_length: invalid value 100: must "
     r"be >= 128 = data\.prompt_length 64 \+ rollout\.max_new_tokens 64"),
    ("sampler.dtype", "float8", r"config\.sampler\.dtype: invalid value 'float8': must be "
     "one of float32"),
    ("model.matmul_precision", "tf32", r"config\.model\.matmul_precision: invalid value "
     "'tf32': must be one of auto"),
    ("mesh.data", 4, r"config\.mesh: invalid value .*: data×fsdp×tensor = 4 must be <= the "
     "1 available devices"),
    ("algorithm.kl.reference_ema", 0.1, r"config\.algorithm\.kl\.reference_ema: invalid "
     "value 0.1: must be 0 without a KL term"),
    ("algorithm.kl.placement", "loss", r"config\.algorithm\.kl\.coef: invalid value 0\.0: "
     r"must be > 0 with algorithm\.kl\.placement='loss'"),
    ("algorithm.kl.controller", "adaptive", r"config\.algorithm\.kl\.controller: invalid "
     r"value 'adaptive': must be 'fixed' unless algorithm\.kl\.placement='reward'"),
    ("algorithm.policy_loss.dual_clip", 0.5, r"config\.algorithm\.policy_loss\.dual_clip: "
     r"invalid value 0\.5: must be > 1"),
    ("algorithm.correction.mode", "clip", r"config\.algorithm\.correction\.mode: invalid "
     "value 'clip': must be one of auto, none, tis"),
    ("algorithm.correction.threshold", 1.0, r"config\.algorithm\.correction\.threshold: "
     r"invalid value 1\.0: must be > 1$"),
    ("sft.carry_slip", 1.5, r"config\.sft\.carry_slip: invalid value 1\.5: must be in "
     r"\[0, 1\]"),
    ("sft.levels", (1, 2, 3), r"config\.sft\.level_weights: invalid value \(1\.0, 2\.0\): "
     r"must have one weight per sft\.levels \(3\)"),
    ("train.eval_samples", -1, r"config\.train\.eval_samples: invalid value -1: must be >= 0"),
    ("optimizer.schedule", "linear", r"config\.optimizer\.schedule: invalid value 'linear': "
     "must be one of constant, cosine"),
])
def test_validation_names_the_field(field, value, match):
  config = preset("dapo")
  *sections, name = field.split(".")
  section = config
  for part in sections:
    section = section[part]
  section[name] = value
  with pytest.raises(ConfigError, match=match):
    validate_config(config, num_devices=1)


def test_mesh_validation_names_the_field():
  config = preset("dapo")  # 16 prompts × 8 samples = 128 rollouts per step
  config.mesh.data, config.mesh.fsdp = -1, 1
  validate_config(config, num_devices=8)
  config.rollout.prompts_per_step, config.train.minibatches = 3, 1  # 24 rollouts
  with pytest.raises(ValueError, match=r"config\.rollout\.prompts_per_step: invalid value 3: "
                     r"the 24 rollouts per step .* must split evenly over mesh data×fsdp = 16"):
    validate_config(config, num_devices=16)
  config.mesh.data, config.mesh.fsdp = -1, 5
  with pytest.raises(ValueError, match=r"config\.mesh: invalid value .*cannot cover 8 devices"):
    validate_config(config, num_devices=8)


def test_tppo_validation():
  config = preset("tppo")
  config.rollout.windows.window_tokens = 0
  with pytest.raises(ValueError, match=r"config\.rollout\.windows\.window_tokens: invalid "
                     "value 0: must be >= 1"):
    validate_config(config, num_devices=1)
  config = preset("tppo")
  config.sampler.prompt_buckets = (64,)
  with pytest.raises(ValueError, match=r"config\.sampler\.prompt_buckets: invalid value "
                     r"\(64,\): must reach 128 = data\.prompt_length 64 \+ the whole windows "
                     r"of rollout\.windows\.window_tokens 32"):
    validate_config(config, num_devices=1)


def test_hf_variant_needs_checkpoint_and_data():
  config = preset("grpo", "hf")
  with pytest.raises(ValueError, match=r"config\.model\.checkpoint: invalid value '': an HF "
                     "checkpoint directory is required"):
    validate_config(config, num_devices=1)
  config.model.checkpoint = "/some/dir"
  with pytest.raises(ValueError, match=r"config\.data\.train_file: invalid value '': a prompt "
                     "file .* is required"):
    validate_config(config, num_devices=1)


def test_unknown_keys_are_rejected_by_the_locked_config():
  config = preset("grpo")
  config.lock()
  with pytest.raises(AttributeError, match="clip_hihg"):
    config.algorithm.policy_loss.clip_hihg = 0.3


def test_rollout_batch_layout():
  batch = batch_lib.build_rollout_batch(
      [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [[-1.0, -2.0], [-3.0, -4.0, -5.0]],
      [1.0, -1.0], [False, True], [0, 0], prompt_length=4, response_length=3, pad_id=0)
  np.testing.assert_array_equal(batch.tokens, [[0, 5, 6, 7, 9, 10, 0], [0, 0, 0, 8, 11, 12, 13]])
  np.testing.assert_array_equal(batch.attention_mask, [[0, 1, 1, 1, 1, 1, 0],
                                                       [0, 0, 0, 1, 1, 1, 1]])
  np.testing.assert_array_equal(batch.response_mask, [[1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(batch.sampler_logprobs, [[-1, -2, 0], [-3, -4, -5]])
  np.testing.assert_array_equal(batch.lengths, [2, 3])
  np.testing.assert_array_equal(np.asarray(batch.token_rewards()), [[0, 1, 0], [0, 0, -1]])
  with pytest.raises(ValueError, match="row 0: prompt of 3 tokens exceeds prompt_length=2"):
    batch_lib.build_rollout_batch([[5, 6, 7]], [[1]], [[0.0]], [0.0], [False], [0],
                                    prompt_length=2, response_length=3, pad_id=0)


@pytest.mark.slow
def test_response_logprobs_match_an_unpadded_forward():
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  model, params = models.init_model(config, seed=3)
  prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
  batch = batch_lib.build_rollout_batch(
      prompts, responses, [[0.0] * 2, [0.0] * 3], [0.0, 0.0], [False, False], [0, 1],
      prompt_length=4, response_length=3, pad_id=0)
  got = np.asarray(batch_lib.response_logprobs(model, params, batch_lib.as_device(batch)))
  for row, (prompt, response) in enumerate(zip(prompts, responses)):
    sequence = jnp.asarray([prompt + response])
    logits, _ = model.apply(params, sequence)
    expected = kernels.token_logprobs(logits[:, len(prompt) - 1:-1], sequence[:, len(prompt):])
    np.testing.assert_allclose(got[row, :len(response)], expected[0], atol=1e-5)
    assert np.all(got[row, len(response):] == 0)


def test_group_estimators_broadcast_per_sample_advantages():
  algorithm = preset("grpo").algorithm
  batch = batch_lib.build_rollout_batch(
      [[1]] * 4, [[2, 3], [2], [2, 3, 4], [5]], [[0.0] * 2, [0.0], [0.0] * 3, [0.0]],
      [1.0, 0.0, 0.0, 0.0], [False] * 4, [0, 0, 1, 1], prompt_length=1, response_length=3,
      pad_id=0)
  advantages, _ = ppo_family.advantages_and_returns(
      algorithm, batch_lib.TrainBatch.from_rollout(batch_lib.as_device(batch)), 0.0,
      group_size=2)
  scores = np.array([1.0, 0.0, 0.0, 0.0]).reshape(2, 2)
  per_sample = ((scores - scores.mean(1, keepdims=True))
                / (scores.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  np.testing.assert_allclose(advantages, per_sample[:, None] * batch.response_mask, atol=1e-5)


def test_rollout_metrics_split_lengths_by_verdict_over_finished_rows():
  from rlhf_jax.rollout.generation import Rollouts
  from rlhf_jax.training.metrics import rollout_metrics
  # Rows of 2, 3, 1 and 4 tokens; the third is a T-PPO row still in flight (no verdict).
  batch = batch_lib.build_rollout_batch(
      [[5]] * 4, [[9, 10], [11, 12, 13], [14], [1, 2, 3, 4]], [[0.0] * 2, [0.0] * 3, [0.0],
                                                               [0.0] * 4],
      [1.0, -1.0, 0.0, 1.0], [False] * 4, [0, 0, 1, 1], prompt_length=2, response_length=4,
      pad_id=0, finished=[True, True, False, True])
  out = rollout_metrics(Rollouts(batch, correct=[True, False, True], failures=[], metrics={}),
                        {"scores": np.asarray([1.0, -1.0, 0.0, 1.0])})
  assert out["response_length_correct_mean"] == (2 + 4) / 2
  assert out["response_length_wrong_mean"] == 3
  assert out["response_length_mean"] == (2 + 3 + 4) / 3 and out["accuracy"] == 2 / 3
  everything_right = rollout_metrics(
      Rollouts(batch, correct=[True] * 3, failures=[], metrics={}),
      {"scores": np.asarray([1.0, 1.0, 0.0, 1.0])})
  assert "response_length_wrong_mean" not in everything_right
