"""The `algorithm` config section of the PPO family, and its validation.

Nested sub-sections, each a concept of its own (docs/formulas.md, from #notation to #t-ppo):
  advantage     the estimator (GAE, GRPO, RLOO, REINFORCE++ ...) and its λ / γ
  policy_loss   the surrogate (PPO clip with clip-higher / dual clip, GSPO, GSPO-token,
                CISPO), aggregation, entropy, positive NLL
  kl            where the KL to the reference goes (none / loss / reward), its
                estimator and β, and the β controller (fixed / adaptive)
  value         the critic's loss and pretraining (estimator 'gae' only)
  overlong      DAPO's soft overlong punishment and the truncation filter
  correction    sampler–trainer mismatch correction (TIS / masked IS)
  staleness     decoupled PPO for tokens sampled by an older policy version
  process_reward  how a PRM's step rewards are refined (Clip / Delta) before the advantages
Presets (configs/*.py) set fields of these sections; nothing else differs.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from rlhf_jax import kernels
from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import losses
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.registry import Section

LAMBDA_SCHEDULES = ("fixed", "length_adaptive")
KL_PLACEMENTS = ("none", "loss", "reward")
KL_CONTROLLERS = ("fixed", "adaptive")
CORRECTION_MODES = ("auto",) + tuple(kernels.ROLLOUT_CORRECTION_MODES)
PROCESS_SHAPINGS = ("none", "clip", "delta", "clip_delta")
# How decoupled PPO bounds a stale token's behaviour weight (kernels.rollout_correction).
STALENESS_MODES = ("tis", "mis_token")
ROUTING_REPLAYS = ("off", "R2", "R3")
# Estimators and policy losses are records (algorithms/estimators.py, algorithms/losses.py):
# validation reads their capabilities, never their names.


def algorithm_config() -> ml_collections.ConfigDict:
  """The `algorithm` section with its defaults (one comment per field)."""
  a = ml_collections.ConfigDict()
  a.name = "grpo"  # Preset name (informational).

  a.advantage = ml_collections.ConfigDict()
  # gae, grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, a registered name or
  # "package.module:name" (algorithms/estimators.py; docs/extending.md).
  a.advantage.estimator = "grpo"
  a.advantage.gamma = 1.0  # Discount γ.
  a.advantage.actor_lam = 0.95  # GAE λ for the actor.
  a.advantage.critic_lam = 1.0  # GAE λ for the critic's targets (VC-PPO: 1.0, Monte Carlo).
  a.advantage.lam_schedule = "fixed"  # 'fixed' (actor_lam) or 'length_adaptive' (VAPO).
  a.advantage.length_adaptive_alpha = 0.05  # VAPO's α in λ = 1 − 1/(α·l).
  a.advantage.whiten = False  # Whiten advantages over the batch (PPO convention).

  a.policy_loss = ml_collections.ConfigDict()
  # The surrogate: 'ppo' (token ratio clip), 'gspo' (sequence ratio clip, arXiv:2507.18071),
  # 'gspo_token' (GSPO with per-token advantages), 'cispo' (clipped stop-gradient IS
  # weight times log π, arXiv:2506.13585), a registered name or "package.module:name"
  # (algorithms/losses.py; docs/extending.md).
  a.policy_loss.kind = "ppo"
  # ε_low (GSPO: 3e-4; CISPO: ε_low^IS, ≥ 1 means no lower bound).
  a.policy_loss.clip_low = 0.2
  a.policy_loss.clip_high = 0.2  # ε_high (DAPO clip-higher: 0.28; GSPO: 4e-4; CISPO: ε_high^IS).
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
  # Correction 'none' takes π_old of a fresh token from the sampler anyway; then the
  # trainer's forward in `prepare` only measures the sampler–trainer mismatch. With one
  # optimizer step per batch (train.epochs = minibatches = 1) and every token fresh it is
  # skipped: the update's own first forward measures the mismatch (update_logprob_gap_*),
  # and the step costs what TRL's does with num_iterations = 1. False: always run it.
  a.correction.reuse_sampler_logprobs = True

  # Tokens sampled by an older policy version (dynamic sampling's kept surplus, a
  # swap_now sampler): decoupled PPO (docs/formulas.md#decoupled-ppo) centres the clip on
  # the trainer's π_prox and weights the token by w = π_prox / π_behav.
  a.staleness = ml_collections.ConfigDict()
  # 'tis' (default): w truncated at cap, so every stale token keeps a clipped weight (the
  # decoupled-PPO objective); 'mis_token': a token whose w leaves [1/cap, cap]
  # gets w = 0 and still counts in the token mean's denominator (AReaL's behaviour mask,
  # which masks only w above its behav_imp_weight_cap).
  a.staleness.mode = "tis"
  a.staleness.cap = 5.0  # C (AReaL's example configs: behav_imp_weight_cap 5.0, floor 0.2).

  a.process_reward = ml_collections.ConfigDict()  # step rewards of reward.process (a PRM)
  # Refinement against reward farming (Gao et al. §4): 'delta' (the return telescopes to
  # the current step's score), 'clip' (min(r − eta, 0)), 'clip_delta', or 'none' (raw).
  a.process_reward.shaping = "delta"
  a.process_reward.eta = 0.5  # Clip's threshold η.
  a.process_reward.coef = 1.0  # Weight of the step rewards beside the outcome score.

  a.moe = ml_collections.ConfigDict()  # a mixture-of-experts policy (docs/moe.md)
  # 'off'; 'R2': the updates replay the experts the π_old forward chose; 'R3': the sampler
  # records each sampled token's experts and the π_old and update forwards replay them.
  a.moe.routing_replay = "off"
  # Under 'off' and 'R2', the in-process sampler records routes anyway, to log the
  # sampler–trainer route flip rate (`moe/route_flip_rate`; R3 always logs it).
  a.moe.measure_route_flips = False
  # Weight of the load-balancing loss (Switch Transformer) of the router; 0 in RL recipes.
  a.moe.aux_loss_coef = 0.0
  # Weight of the router z-loss (ST-MoE): mean logsumexp(router logits)².
  a.moe.z_loss_coef = 0.0
  return a


# Checked against the rollout's group size and response budget, which algorithms/ cannot
# read (rollout/ sits above it): training/config.py's rule "algorithm fit" runs
# `validate_algorithm_config`.
SECTION = Section("algorithm", at="algorithm", fields=algorithm_config)


def uses_critic(algorithm) -> bool:
  """Whether the estimator needs a value model (its record's `needs_critic`)."""
  return estimators.estimator(algorithm.advantage.estimator).needs_critic


def reads_token_rewards(algorithm) -> bool:
  """Whether the estimator reads per-token rewards (its record's `reads_token_rewards`):
  a PRM's step rewards, an environment's turn rewards, KL in the reward reach it."""
  return estimators.estimator(algorithm.advantage.estimator).reads_token_rewards


def uses_reference(algorithm) -> bool:
  """Whether a reference policy is needed: KL as a loss or in the reward, or an
  estimator that reads its log-probs (`needs_reference`: e.g. a teacher's)."""
  return (algorithm.kl.placement != "none"
          or estimators.estimator(algorithm.advantage.estimator).needs_reference)


def trainer_holds_reference(c) -> bool:
  """Whether the trainer keeps a frozen reference copy: a KL term whose log π_ref the
  sampling servers do not bring with the batch (`rollout.reference_logprobs`)."""
  return uses_reference(c.algorithm) and c.rollout.reference_logprobs != "sampler"


def reuses_sampler_logprobs(algorithm, train, correction: str) -> bool:
  """Whether π_old may be the sampler's log-probs when every token is fresh: one
  optimizer step per batch (its first forward is the current policy's) and no
  correction (sampler and trainer compute alike)."""
  return (algorithm.correction.reuse_sampler_logprobs and correction == "none"
          and train.epochs == 1 and train.minibatches == 1)


def correction_mode(algorithm, *, trainer_dtype: str, sampler_dtype: str) -> str:
  """The rollout-correction mode in force: 'auto' is 'tis' when the sampler computes
  in another dtype than the trainer (bf16 rollouts), else 'none'."""
  mode = algorithm.correction.mode
  if mode == "auto":
    return "tis" if trainer_dtype != sampler_dtype else "none"
  return mode


def validate_algorithm_config(a, *, group_size: int, response_length: int) -> None:
  """Raises ConfigError naming the `algorithm.*` field of an impossible setting
  (`group_size`, `response_length`: rollout.group_size, rollout.max_new_tokens)."""
  v, p = a.advantage, a.policy_loss
  estimator = estimators.estimator(v.estimator)
  if estimator.group_based and group_size < 2:
    invalid("rollout.group_size", group_size, f"must be >= 2 for algorithm.advantage."
            f"estimator={v.estimator!r} (a baseline from the group)")
  for field in ("gamma", "actor_lam", "critic_lam"):
    check_range(f"algorithm.advantage.{field}", v[field], low=0, high=1)
  one_of("algorithm.advantage.lam_schedule", v.lam_schedule, LAMBDA_SCHEDULES)
  check_range("algorithm.advantage.length_adaptive_alpha", v.length_adaptive_alpha, low=0,
              low_open=True)
  _validate_surrogate(p, estimator)
  one_of("algorithm.policy_loss.agg", p.agg, kernels.AGGREGATION_MODES)
  for field in ("entropy_coef", "positive_nll_coef"):
    check_range(f"algorithm.policy_loss.{field}", p[field], low=0)
  _validate_kl(a.kl)
  _validate_value(a)
  check_range("algorithm.overlong.buffer", a.overlong.buffer, low=1,
              high=response_length if a.overlong.penalty else None,
              note="(rollout.max_new_tokens)" if a.overlong.penalty else "")
  check_range("algorithm.overlong.factor", a.overlong.factor, low=0)
  one_of("algorithm.correction.mode", a.correction.mode, CORRECTION_MODES)
  check_range("algorithm.correction.threshold", a.correction.threshold, low=1, low_open=True)
  _validate_staleness(a.staleness)
  one_of("algorithm.moe.routing_replay", a.moe.routing_replay, ROUTING_REPLAYS)
  check_range("algorithm.moe.aux_loss_coef", a.moe.aux_loss_coef, low=0)
  check_range("algorithm.moe.z_loss_coef", a.moe.z_loss_coef, low=0)
  one_of("algorithm.process_reward.shaping", a.process_reward.shaping, PROCESS_SHAPINGS)
  check_range("algorithm.process_reward.coef", a.process_reward.coef, low=0)


def _validate_surrogate(p, estimator: estimators.Estimator) -> None:
  """The policy loss's record decides: its clip bounds, the options it reads (PPO's
  dual_clip), and whether it takes one advantage per response."""
  loss = losses.policy_loss(p.kind)
  loss.check_clip(p)
  for name in loss.options:
    if name not in p:
      invalid("algorithm.policy_loss.kind", p.kind, f"reads algorithm.policy_loss.{name}, "
              "which the section does not have")
  if p.dual_clip is not None and "dual_clip" not in loss.options:
    readers = [n for n in losses.names() if "dual_clip" in losses.policy_loss(n).options]
    invalid("algorithm.policy_loss.dual_clip", p.dual_clip, "must be None with "
            f"algorithm.policy_loss.kind={p.kind!r} (it bounds the token ratio of "
            f"{', '.join(readers)}; GSPO clips whole sequences, CISPO's weight is capped at "
            "1 + clip_high)")
  if p.dual_clip is not None:
    check_range("algorithm.policy_loss.dual_clip", p.dual_clip, low=1, low_open=True,
                note="(None: off)")
  if loss.sequence_advantages and estimator.token_advantages:
    token_level = [n for n in losses.names() if not losses.policy_loss(n).sequence_advantages]
    invalid("algorithm.policy_loss.kind", p.kind, f"must be one of {', '.join(token_level)} "
            f"with algorithm.advantage.estimator={estimator.name!r}: its advantages are per "
            f"token, {p.kind!r} takes one per response (a sequence clip)")


def _validate_staleness(s) -> None:
  one_of("algorithm.staleness.mode", s.mode, STALENESS_MODES)
  check_range("algorithm.staleness.cap", s.cap, low=1, low_open=True)


def _validate_value(a) -> None:
  if a.value.clip is not None:
    check_range("algorithm.value.clip", a.value.clip, low=0, low_open=True,
                note="(None: unclipped)")
  check_range("algorithm.value.pretrain_steps", a.value.pretrain_steps, low=0)
  if a.value.pretrain_steps and not uses_critic(a):
    invalid("algorithm.value.pretrain_steps", a.value.pretrain_steps, "must be 0 without a "
            f"critic (algorithm.advantage.estimator={a.advantage.estimator!r} has none)")


def _validate_kl(kl) -> None:
  one_of("algorithm.kl.placement", kl.placement, KL_PLACEMENTS)
  one_of("algorithm.kl.estimator", kl.estimator, kernels.KL_ESTIMATORS)
  check_range("algorithm.kl.coef", kl.coef, low=0)
  if kl.placement != "none" and kl.coef == 0:
    invalid("algorithm.kl.coef", kl.coef, f"must be > 0 with algorithm.kl.placement="
            f"{kl.placement!r} (or set placement 'none')")
  one_of("algorithm.kl.controller", kl.controller, KL_CONTROLLERS)
  if kl.controller == "adaptive" and kl.placement != "reward":
    invalid("algorithm.kl.controller", kl.controller, "must be 'fixed' unless "
            "algorithm.kl.placement='reward' (it adapts the in-reward β)")
  check_range("algorithm.kl.target", kl.target, low=0, low_open=True)
  check_range("algorithm.kl.horizon", kl.horizon, low=0, low_open=True)
  check_range("algorithm.kl.reference_ema", kl.reference_ema, low=0, high=1)
  if kl.reference_ema and kl.placement == "none":
    invalid("algorithm.kl.reference_ema", kl.reference_ema, "must be 0 without a KL term "
            "(algorithm.kl.placement 'loss' or 'reward')")
