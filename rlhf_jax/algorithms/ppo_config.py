"""The `algorithm` config section of the PPO family, and its validation.

Nested sub-sections, each a concept of its own (ALGORITHMS.md §0–§5):
  advantage     the estimator (GAE, GRPO, RLOO, REINFORCE++ ...) and its λ / γ
  policy_loss   PPO clip (clip-higher, dual clip), aggregation, entropy, positive NLL
  kl            where the KL to the reference goes (none / loss / reward), its
                estimator and β, and the β controller (fixed / adaptive)
  value         the critic's loss and pretraining (estimator 'gae' only)
  overlong      DAPO's soft overlong punishment and the truncation filter
  correction    sampler–trainer mismatch correction (TIS / masked IS)
  process_reward  how a PRM's step rewards are refined (Clip / Delta) before the advantages
Presets (configs/*.py) set fields of these sections; nothing else differs.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from rlhf_jax import kernels
from rlhf_jax.config_errors import fail

ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
CRITIC_ESTIMATORS = ("gae",)
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
LAMBDA_SCHEDULES = ("fixed", "length_adaptive")
KL_PLACEMENTS = ("none", "loss", "reward")
KL_CONTROLLERS = ("fixed", "adaptive")
CORRECTION_MODES = ("auto",) + tuple(kernels.ROLLOUT_CORRECTION_MODES)
PROCESS_SHAPINGS = ("none", "clip", "delta", "clip_delta")
# Estimators whose advantages read per-token rewards (the others use sequence scores).
TOKEN_REWARD_ESTIMATORS = ("gae", "reinforce_pp")


def algorithm_config() -> ml_collections.ConfigDict:
  """The `algorithm` section with its defaults (one comment per field)."""
  a = ml_collections.ConfigDict()
  a.name = "grpo"  # Preset name (informational).

  a.advantage = ml_collections.ConfigDict()
  a.advantage.estimator = "grpo"  # gae, grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline.
  a.advantage.gamma = 1.0  # Discount γ.
  a.advantage.actor_lam = 0.95  # GAE λ for the actor.
  a.advantage.critic_lam = 1.0  # GAE λ for the critic's targets (VC-PPO: 1.0, Monte Carlo).
  a.advantage.lam_schedule = "fixed"  # 'fixed' (actor_lam) or 'length_adaptive' (VAPO).
  a.advantage.length_adaptive_alpha = 0.05  # VAPO's α in λ = 1 − 1/(α·l).
  a.advantage.whiten = False  # Whiten advantages over the batch (PPO convention).

  a.policy_loss = ml_collections.ConfigDict()
  a.policy_loss.clip_low = 0.2  # ε_low.
  a.policy_loss.clip_high = 0.2  # ε_high (DAPO clip-higher: 0.28).
  a.policy_loss.dual_clip = config_dict.placeholder(float)  # Dual-clip c > 1; None: off.
  a.policy_loss.agg = "token-mean"  # Loss aggregation mode (kernels.AGGREGATION_MODES).
  a.policy_loss.entropy_coef = 0.0  # Entropy bonus coefficient.
  a.policy_loss.positive_nll_coef = 0.0  # VAPO μ: NLL on positive samples.
  a.policy_loss.positive_threshold = 0.0  # A sample is positive when its score exceeds this.

  a.kl = ml_collections.ConfigDict()
  a.kl.placement = "none"  # 'none', 'loss' (GRPO: β·KL in the loss) or 'reward' (InstructGPT).
  a.kl.estimator = "k3"  # k1, k2, k3, abs, and straight-through 'k1+', 'k3+', ...
  a.kl.coef = 0.0  # β (GRPO paper 0.04); its start value with the adaptive controller.
  a.kl.controller = "fixed"  # 'fixed' β or 'adaptive' (Ziegler et al. 2019; reward placement).
  a.kl.target = 0.1  # Adaptive controller: target KL.
  a.kl.horizon = 10000.0  # Adaptive controller: horizon in samples (verl / OpenRLHF 10000).
  a.kl.reference_ema = 0.0  # η: reference ← (1−η)·reference + η·actor after each step.

  a.value = ml_collections.ConfigDict()  # the critic (advantage.estimator 'gae')
  a.value.clip = config_dict.placeholder(float)  # Value-loss clip ε_v; None: unclipped.
  a.value.pretrain_steps = 0  # VC-PPO/VAPO: steps training only the critic first.

  a.overlong = ml_collections.ConfigDict()
  a.overlong.penalty = False  # DAPO soft overlong punishment (Eq. 13).
  a.overlong.buffer = 16  # Its L_cache in tokens (paper: 4096 of 20480).
  a.overlong.factor = 1.0  # Its scale.
  a.overlong.filter = False  # Drop truncated responses from the loss.

  a.correction = ml_collections.ConfigDict()
  # Sampler–trainer mismatch correction: 'auto' (tis when model.dtype != sampler.dtype,
  # else none), 'none', 'tis', 'mis_token', 'mis_sequence'.
  a.correction.mode = "auto"
  a.correction.threshold = 2.0  # C: TIS truncation / MIS trust region [1/C, C] (verl 2.0).

  a.process_reward = ml_collections.ConfigDict()  # step rewards of reward.process (a PRM)
  # Refinement against reward farming (Gao et al. §4): 'delta' (the return telescopes to
  # the current step's score), 'clip' (min(r − eta, 0)), 'clip_delta', or 'none' (raw).
  a.process_reward.shaping = "delta"
  a.process_reward.eta = 0.5  # Clip's threshold η.
  a.process_reward.coef = 1.0  # Weight of the step rewards beside the outcome score.
  return a


def uses_critic(algorithm) -> bool:
  """Whether the estimator needs a value model."""
  return algorithm.advantage.estimator in CRITIC_ESTIMATORS


def uses_reference(algorithm) -> bool:
  """Whether a reference policy is needed (KL as a loss or in the reward)."""
  return algorithm.kl.placement != "none"


def correction_mode(algorithm, *, trainer_dtype: str, sampler_dtype: str) -> str:
  """The rollout-correction mode in force: 'auto' is 'tis' when the sampler computes
  in another dtype than the trainer (bf16 rollouts), else 'none'."""
  mode = algorithm.correction.mode
  if mode == "auto":
    return "tis" if trainer_dtype != sampler_dtype else "none"
  return mode


def validate_algorithm_config(a, *, group_size: int, response_length: int) -> None:
  """Raises ConfigError naming the `algorithm.*` field of an impossible setting."""
  v, p, kl = a.advantage, a.policy_loss, a.kl
  if v.estimator not in ESTIMATORS:
    fail("algorithm.advantage.estimator", f"={v.estimator!r} is not one of {', '.join(ESTIMATORS)}")
  if v.estimator in GROUP_ESTIMATORS and group_size < 2:
    fail("rollout.group_size", f"={group_size} must be >= 2 for estimator {v.estimator!r}")
  for field in ("gamma", "actor_lam", "critic_lam"):
    if not 0 <= v[field] <= 1:
      fail(f"algorithm.advantage.{field}", f"={v[field]} must be in [0, 1]")
  if v.lam_schedule not in LAMBDA_SCHEDULES:
    fail("algorithm.advantage.lam_schedule", f"={v.lam_schedule!r} is not one of "
         f"{', '.join(LAMBDA_SCHEDULES)}")
  if v.lam_schedule == "length_adaptive" and v.length_adaptive_alpha <= 0:
    fail("algorithm.advantage.length_adaptive_alpha", f"={v.length_adaptive_alpha} must be > 0")
  if not 0 <= p.clip_low < 1:
    fail("algorithm.policy_loss.clip_low", f"={p.clip_low} must be in [0, 1)")
  if p.clip_high < p.clip_low:
    fail("algorithm.policy_loss.clip_high", f"={p.clip_high} must be >= clip_low={p.clip_low}")
  if p.dual_clip is not None and p.dual_clip <= 1:
    fail("algorithm.policy_loss.dual_clip", f"={p.dual_clip} must be > 1 (None: off)")
  if p.agg not in kernels.AGGREGATION_MODES:
    fail("algorithm.policy_loss.agg", f"={p.agg!r} is not one of "
         f"{', '.join(kernels.AGGREGATION_MODES)}")
  for field in ("entropy_coef", "positive_nll_coef"):
    if p[field] < 0:
      fail(f"algorithm.policy_loss.{field}", f"={p[field]} must be >= 0")
  _validate_kl(kl)
  if a.value.clip is not None and a.value.clip <= 0:
    fail("algorithm.value.clip", f"={a.value.clip} must be > 0 (None: unclipped)")
  if a.value.pretrain_steps < 0:
    fail("algorithm.value.pretrain_steps", f"={a.value.pretrain_steps} must be >= 0")
  if a.value.pretrain_steps and not uses_critic(a):
    fail("algorithm.value.pretrain_steps", f"={a.value.pretrain_steps} needs a critic "
         "(advantage.estimator 'gae')")
  if a.overlong.penalty and not 0 < a.overlong.buffer <= response_length:
    fail("algorithm.overlong.buffer", f"={a.overlong.buffer} must be in (0, "
         f"rollout.max_new_tokens={response_length}]")
  if a.correction.mode not in CORRECTION_MODES:
    fail("algorithm.correction.mode", f"={a.correction.mode!r} is not one of "
         f"{', '.join(CORRECTION_MODES)}")
  if a.correction.threshold <= 1:
    fail("algorithm.correction.threshold", f"={a.correction.threshold} must be > 1")
  if a.process_reward.shaping not in PROCESS_SHAPINGS:
    fail("algorithm.process_reward.shaping", f"={a.process_reward.shaping!r} is not one of "
         f"{', '.join(PROCESS_SHAPINGS)}")
  if a.process_reward.coef < 0:
    fail("algorithm.process_reward.coef", f"={a.process_reward.coef} must be >= 0")


def _validate_kl(kl) -> None:
  if kl.placement not in KL_PLACEMENTS:
    fail("algorithm.kl.placement", f"={kl.placement!r} is not one of {', '.join(KL_PLACEMENTS)}")
  if kl.estimator not in kernels.KL_ESTIMATORS:
    fail("algorithm.kl.estimator", f"={kl.estimator!r} is not one of "
         f"{', '.join(kernels.KL_ESTIMATORS)}")
  if kl.coef < 0:
    fail("algorithm.kl.coef", f"={kl.coef} must be >= 0")
  if kl.placement != "none" and kl.coef == 0:
    fail("algorithm.kl.coef", f"=0 with kl.placement={kl.placement!r}: set β > 0 or "
         "placement 'none'")
  if kl.controller not in KL_CONTROLLERS:
    fail("algorithm.kl.controller", f"={kl.controller!r} is not one of "
         f"{', '.join(KL_CONTROLLERS)}")
  if kl.controller == "adaptive" and kl.placement != "reward":
    fail("algorithm.kl.controller", "='adaptive' adapts the in-reward β: it needs "
         "kl.placement='reward'")
  if kl.target <= 0:
    fail("algorithm.kl.target", f"={kl.target} must be > 0")
  if kl.horizon <= 0:
    fail("algorithm.kl.horizon", f"={kl.horizon} must be > 0")
  if not 0 <= kl.reference_ema <= 1:
    fail("algorithm.kl.reference_ema", f"={kl.reference_ema} must be in [0, 1]")
  if kl.reference_ema and kl.placement == "none":
    fail("algorithm.kl.reference_ema", "needs a KL term (kl.placement 'loss' or 'reward')")
