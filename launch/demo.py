r"""A tour of rlhf_jax.kernels on a synthetic rollout batch.

Builds G responses for each of a few prompts (random token logits, ±1 verifier
scores, ragged lengths), then computes what one update of GRPO, DAPO, VC-PPO
and VAPO would: rewards with the overlong penalty, advantages from each
estimator, the clipped policy loss with its clip metrics, the value loss, the
KL to a reference and VAPO's positive-example NLL. Prints a table and one JSON
line of the figures.

  python launch/demo.py --config=configs/kernel_demo.py [--config.group_size=8]
"""

from __future__ import annotations

import json

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from rlhf_jax import kernels
from rlhf_jax.config_errors import invalid

_CONFIG = config_flags.DEFINE_config_file("config", None, "Demo config file.",
                                          lock_config=True)
flags.mark_flags_as_required(["config"])

VOCAB = 64


def validate(config) -> None:
  """Rejects impossible settings, naming the field, before anything is traced."""
  checks = [
      ("num_prompts", config.num_prompts >= 1, "must be >= 1"),
      ("group_size", config.group_size >= 2, "must be >= 2 (group baselines need two samples)"),
      ("max_response_length", config.max_response_length >= 2, "must be >= 2"),
      ("buffer_length", 0 < config.buffer_length <= config.max_response_length,
       f"must be in (0, max_response_length={config.max_response_length}]"),
      ("gamma", 0.0 <= config.gamma <= 1.0, "must be in [0, 1]"),
      ("actor_lam", 0.0 <= config.actor_lam <= 1.0, "must be in [0, 1]"),
      ("critic_lam", 0.0 <= config.critic_lam <= 1.0, "must be in [0, 1]"),
      ("vapo_alpha", config.vapo_alpha > 0, "must be > 0"),
      ("clip_low", 0.0 <= config.clip_low < 1.0, "must be in [0, 1)"),
      ("clip_high", config.clip_high >= config.clip_low,
       f"must be >= clip_low={config.clip_low}"),
      ("dual_clip", config.dual_clip > 1.0, "must be > 1"),
      ("agg", config.agg in kernels.AGGREGATION_MODES,
       f"must be one of {', '.join(kernels.AGGREGATION_MODES)}"),
      ("kl_estimator", config.kl_estimator in kernels.KL_ESTIMATORS,
       f"must be one of {', '.join(kernels.KL_ESTIMATORS)}"),
  ]
  for field, ok, requirement in checks:
    if not ok:
      invalid(field, config[field], requirement)


def synthetic_rollouts(config):
  """Ragged responses with logits of the current, old and reference policies."""
  rng = np.random.default_rng(config.seed)
  batch, time = config.num_prompts * config.group_size, config.max_response_length
  lengths = rng.integers(1, time + 1, batch)
  mask = (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32)
  logits = rng.standard_normal((batch, time, VOCAB)).astype(np.float32)
  tokens = rng.integers(0, VOCAB, (batch, time)).astype(np.int32)
  old_logits = logits + 0.3 * rng.standard_normal(logits.shape).astype(np.float32)
  ref_logits = logits + 0.1 * rng.standard_normal(logits.shape).astype(np.float32)
  correct = rng.random(batch) < 0.5
  values = rng.normal(0.0, 0.5, (batch, time)).astype(np.float32)
  return dict(lengths=lengths, mask=mask, logits=logits, old_logits=old_logits,
              ref_logits=ref_logits, tokens=tokens, correct=correct, values=values)


def one_update(config, batch):
  """Everything a PPO-family update computes from a rollout batch, in one jit."""
  mask = batch["mask"]
  logprobs = kernels.token_logprobs(batch["logits"], batch["tokens"])
  old_logprobs = kernels.token_logprobs(batch["old_logits"], batch["tokens"])
  ref_logprobs = kernels.token_logprobs(batch["ref_logits"], batch["tokens"])
  entropy = kernels.entropy_from_logits(batch["logits"])

  # DAPO reward: ±1 correctness plus the soft overlong punishment, at the last token.
  scores = (jnp.where(batch["correct"], 1.0, -1.0)
            + kernels.overlong_penalty(batch["lengths"],
                                       max_length=config.max_response_length,
                                       buffer_length=config.buffer_length))
  token_rewards = kernels.place_at_last_token(scores, mask)

  group = config.group_size
  grpo = kernels.group_advantages(scores, group_size=group)[:, None] * mask
  dr_grpo = kernels.group_advantages(scores, group_size=group,
                                     normalize_by_std=False)[:, None] * mask
  rloo = kernels.rloo_advantages(scores, group_size=group)[:, None] * mask
  vcppo_adv, vcppo_returns = kernels.decoupled_gae(
      token_rewards, batch["values"], mask, gamma=config.gamma, actor_lam=config.actor_lam,
      critic_lam=config.critic_lam)
  vapo_lam = kernels.length_adaptive_lambda(batch["lengths"], alpha=config.vapo_alpha)
  vapo_adv, _ = kernels.decoupled_gae(token_rewards, batch["values"], mask, gamma=config.gamma,
                                      actor_lam=vapo_lam, critic_lam=config.critic_lam)
  estimators = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo,
                "vcppo_gae": kernels.masked_whiten(vcppo_adv, mask),
                "vapo_gae": kernels.masked_whiten(vapo_adv, mask)}

  results = {}
  for name, advantages in estimators.items():
    loss, metrics = kernels.ppo_policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_low=config.clip_low,
        clip_high=config.clip_high, dual_clip=config.dual_clip, agg=config.agg)
    results[name] = dict(adv_mean=kernels.masked_mean(advantages, mask),
                         adv_std=jnp.sqrt(kernels.masked_var(advantages, mask)),
                         policy_loss=loss, **metrics)
  value, value_metrics = kernels.value_loss(batch["values"] + 0.1, batch["values"],
                                            vcppo_returns, mask)
  extras = dict(
      mean_reward=jnp.mean(scores),
      mean_entropy=kernels.masked_mean(entropy, mask),
      kl_to_ref=kernels.masked_mean(
          kernels.kl_penalty(logprobs, ref_logprobs, estimator=config.kl_estimator), mask),
      vapo_positive_nll=kernels.positive_nll_loss(logprobs, mask, batch["correct"]),
      vapo_lambda_min=jnp.min(vapo_lam), vapo_lambda_max=jnp.max(vapo_lam),
      value_loss=value, explained_variance=kernels.explained_variance(
          batch["values"], vcppo_returns, mask), **value_metrics)
  return results, extras


def main(argv):
  del argv
  config = _CONFIG.value
  validate(config)
  batch = synthetic_rollouts(config)
  results, extras = jax.device_get(jax.jit(lambda b: one_update(config, b))(batch))
  print(f"{config.num_prompts} prompts x {config.group_size} samples, "
        f"responses of {int(batch['lengths'].min())}-{int(batch['lengths'].max())} tokens, "
        f"aggregation {config.agg}, clip [{config.clip_low}, {config.clip_high}], "
        f"dual clip {config.dual_clip}")
  header = ["estimator", "adv_mean", "adv_std", "policy_loss", "clip_frac_upper",
            "clip_frac_lower", "dual_clip_frac", "approx_kl"]
  print(" ".join(f"{h:>15s}" for h in header))
  for name, row in results.items():
    print(f"{name:>15s} " + " ".join(f"{float(row[h]):15.4f}" for h in header[1:]))
  for key, value in extras.items():
    print(f"{key:>20s}: {float(value):.4f}")
  summary = {name: {k: float(v) for k, v in row.items()} for name, row in results.items()}
  summary["extras"] = {k: float(v) for k, v in extras.items()}
  print(json.dumps(summary))


if __name__ == "__main__":
  from rlhf_jax import cli
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  cli.run(main)  # config errors as one line, exit status 2
