"""Config for launch/demo.py: a toy rollout batch pushed through the kernels.

  python launch/demo.py --config=configs/kernel_demo.py --config.group_size=8
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the demo's config; every field is overridable with --config.<field>=..."""
  config = ml_collections.ConfigDict()
  config.seed = 0  # PRNG seed for the synthetic rollouts.
  config.num_prompts = 4  # Prompts in the batch.
  config.group_size = 4  # Responses per prompt (GRPO's G).
  config.max_response_length = 24  # Response tokens per row (padding width).
  config.buffer_length = 8  # DAPO overlong buffer L_cache (tokens) inside max_response_length.
  config.gamma = 1.0  # Discount γ (1.0 throughout the reasoning-RL papers).
  config.actor_lam = 0.95  # λ for policy advantages (VC-PPO).
  config.critic_lam = 1.0  # λ for value targets (VC-PPO: Monte-Carlo).
  # α of VAPO's λ = 1 − 1/(α·l). The paper's 0.05 suits responses of thousands of
  # tokens (λ = 0 for l ≤ 20); 0.5 gives the toy's 1-24-token responses λ in [0, 0.92].
  config.vapo_alpha = 0.5
  config.clip_low = 0.2  # ε_low (DAPO).
  config.clip_high = 0.28  # ε_high, "clip-higher" (DAPO).
  config.dual_clip = 3.0  # Dual-clip constant c (verl default).
  config.agg = "token-mean"  # Loss aggregation mode.
  config.kl_estimator = "k3"  # KL estimator for the reference penalty.
  return config
