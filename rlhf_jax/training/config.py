"""The trainer's config: one schema for every preset, and its validation.

configs/{ppo,grpo,dapo,vcppo,vapo,tppo}.py start from `base_config(variant)`
and change only the `algorithm` section (and a few sizes). `validate_config`
runs before anything loads or compiles; every error names the field and the
allowed values.
"""

from __future__ import annotations

import importlib.util

import ml_collections

from rlhf_jax import kernels
from rlhf_jax.algorithms import ppo_family
from rlhf_jax import parallel
from rlhf_jax.algorithms import windowed
from rlhf_jax.sampling import config as sampler_config_lib

VARIANTS = ("arith", "hf")


def base_config(variant: str) -> ml_collections.ConfigDict:
  """Every field with its default; presets override the `algorithm` section."""
  if variant not in VARIANTS:
    raise ValueError(f"config variant {variant!r}; allowed: {', '.join(VARIANTS)}.")
  arith = variant == "arith"
  c = ml_collections.ConfigDict()
  c.variant = variant  # 'arith' (built-in task, tiny model) or 'hf' (your checkpoint and JSONL).
  c.seed = 0  # Seeds model init (arith), data order, sampling.

  c.model = ml_collections.ConfigDict()
  c.model.checkpoint = ""  # HF directory of the initial policy; arith: empty = <workdir>/sft.
  c.model.hidden_size = 128  # arith tiny model: width.
  c.model.num_layers = 3  # arith tiny model: layers.
  c.model.num_heads = 4  # arith tiny model: query heads.

  c.data = ml_collections.ConfigDict()
  c.data.train_file = ""  # JSONL of prompts (prompt, answer, task); arith: empty = generated.
  c.data.eval_file = ""  # JSONL of held-out prompts; arith: empty = generated (other seeds).
  c.data.levels = (1, 2)  # arith difficulty levels of generated problems.
  c.data.level_weights = (1.0, 1.0)  # arith: sampling weight of each level.
  c.data.num_train = 20000  # arith: generated training prompts.
  c.data.num_eval = 256  # arith: generated held-out prompts (eval every eval_every steps).
  c.data.prompt_length = 64 if arith else 512  # P: prompt tokens (left-padded; longer = error).
  c.data.shuffle = True  # Shuffle the prompts each epoch (False: file order).

  c.sft = ml_collections.ConfigDict()  # arith warm start (launch/sft.py, or train.py when missing)
  c.sft.steps = 600  # SFT steps.
  c.sft.batch_size = 64  # Problems per SFT step.
  c.sft.learning_rate = 3e-3  # Peak AdamW learning rate (warmup 20 steps, cosine to 10%).
  c.sft.levels = (1, 2, 3)  # Difficulty levels of the SFT problems.
  c.sft.level_weights = (3.0, 2.0, 1.0)  # Their weights (easier heavier: RL has room to grow).
  # Fraction of SFT demonstrations that give only "Answer: N" instead of the worked
  # digit-serial solution. The tiny model imitates that style but cannot get it right,
  # so RL has a strategy to discover (the README's demo); 0 = worked solutions only.
  c.sft.direct_fraction = 0.6

  c.rollout = ml_collections.ConfigDict()
  c.rollout.prompts_per_step = 16 if arith else 128  # Prompts (groups) per training step.
  c.rollout.max_new_tokens = 96 if arith else 1024  # R: response cap (tokens).
  c.rollout.stop_at_eos = True  # End a response at the EOS token (False: always max_new_tokens).
  c.rollout.temperature = 1.0  # Sampling temperature during training (RL: 1.0).
  c.rollout.top_p = 1.0  # Nucleus sampling during training.
  c.rollout.top_k = 0  # Top-k during training (0: none).
  c.rollout.fire = False  # FIRE: first response token at fire_temperature / fire_top_k.
  c.rollout.fire_temperature = 30.0  # FIRE hot temperature (paper: 30).
  c.rollout.fire_top_k = 16  # FIRE hot top-k (paper: 16).

  c.sampler = sampler_config_lib.sampler_config(
      num_slots=64 if arith else 256, cache_length=(64 + 96) if arith else 1536,
      prompt_buckets=(64,) if arith else (512,))

  c.reward = ml_collections.ConfigDict()
  c.reward.correct_score = 1.0  # Reward of a verified answer (DAPO: +1).
  c.reward.wrong_score = -1.0  # Reward of a wrong answer (DAPO: −1).
  c.reward.failure_score = -1.0  # Reward when the verifier raises or times out.
  c.reward.timeout_s = 5.0  # Per-sample verifier time limit.

  c.algorithm = ml_collections.ConfigDict()
  a = c.algorithm
  a.name = "grpo"  # Preset name (informational).
  # Advantage estimator: gae, grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline.
  a.estimator = "grpo"
  a.group_size = 8  # G: samples per prompt.
  a.gamma = 1.0  # Discount γ.
  a.actor_lam = 0.95  # GAE λ for the actor.
  a.critic_lam = 1.0  # GAE λ for the critic's targets (VC-PPO: 1.0, Monte Carlo).
  a.length_adaptive_alpha = 0.0  # VAPO's α for λ = 1 − 1/(α·l); 0 = off.
  a.whiten_advantages = False  # Whiten advantages over the batch (PPO convention).
  a.clip_low = 0.2  # ε_low.
  a.clip_high = 0.2  # ε_high (DAPO clip-higher: 0.28).
  a.dual_clip = 0.0  # Dual-clip c (> 1; 0 = off).
  a.agg = "token-mean"  # Loss aggregation mode.
  a.kl_estimator = "k3"  # KL estimator for the reference penalty.
  a.kl_loss_coef = 0.0  # β of the KL loss term (GRPO paper 0.04); 0 = off.
  a.kl_reward_coef = 0.0  # β of the KL in the reward (InstructGPT PPO); 0 = off.
  # Adaptive KL controller (Ziegler et al. 2019) for kl_reward_coef: target KL; 0 = fixed β.
  a.kl_target = 0.0
  a.kl_horizon = 10000.0  # Its horizon in samples (verl / OpenRLHF 10000).
  a.ref_ema = 0.0  # η: reference ← (1−η)·reference + η·actor after each step; 0 = fixed.
  a.entropy_coef = 0.0  # Entropy bonus coefficient.
  a.positive_nll_coef = 0.0  # VAPO μ: NLL on correct samples; 0 = off.
  a.positive_threshold = 0.0  # A sample is "positive" when its score exceeds this.
  a.value_clip = 0.5  # Value-loss clip ε_v (0 = off).
  a.value_pretrain_steps = 0  # VC-PPO/VAPO: steps training only the critic first.
  a.overlong_buffer = 0  # DAPO soft overlong punishment L_cache in tokens (0 = off).
  a.overlong_factor = 1.0  # Its scale.
  a.overlong_filter = False  # Drop truncated responses from the loss.
  a.dynamic_sampling = False  # DAPO: keep only groups whose correctness varies.
  a.max_generation_rounds = 10  # Dynamic sampling: fruitless rounds before giving up.
  a.oversample = 3  # Dynamic sampling: prompts per round = oversample × prompts_per_step (verl 3×).
  a.window_tokens = 0  # T-PPO: new tokens per response per step (0 = whole responses).

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 2e-4 if arith else 1e-6  # Actor peak learning rate.
  c.optimizer.warmup_steps = 5 if arith else 20  # Linear warmup (DAPO: 20), then constant.
  c.optimizer.weight_decay = 0.0  # AdamW weight decay (DAPO script: 0.1).
  c.optimizer.max_grad_norm = 1.0  # Global-norm gradient clipping.
  c.optimizer.critic_learning_rate = 1e-3 if arith else 1e-5  # Critic peak learning rate.

  c.train = ml_collections.ConfigDict()
  c.train.steps = 60 if arith else 1000  # Training steps (one rollout batch each).
  c.train.ppo_epochs = 1  # Passes over each rollout batch.
  c.train.minibatches = 2  # Optimizer steps per epoch (the batch split evenly).
  c.train.eval_every = 10 if arith else 50  # Held-out greedy accuracy every N steps (and at
  # start and end).
  c.train.checkpoint_every = 20  # Save a checkpoint every N steps (and at the end).
  c.train.log_every = 1  # Console progress line every N steps.
  c.train.tensorboard = True  # Also write TensorBoard event files (needs the tensorboard extra).
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # Mesh axis sizes (product ≤ devices; -1 takes the rest).
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return c


def validate_config(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ValueError naming the field of an impossible setting (before any compile)."""
  def fail(field, message):
    raise ValueError(f"config.{field}{'' if message.startswith('=') else ' '}{message}.")

  if c.variant not in VARIANTS:
    fail("variant", f"={c.variant!r} is not one of {', '.join(VARIANTS)}")
  a = c.algorithm
  if a.estimator not in ppo_family.ESTIMATORS:
    fail("algorithm.estimator", f"={a.estimator!r} is not one of "
         f"{', '.join(ppo_family.ESTIMATORS)}")
  if a.agg not in kernels.AGGREGATION_MODES:
    fail("algorithm.agg", f"={a.agg!r} is not one of {', '.join(kernels.AGGREGATION_MODES)}")
  if a.kl_estimator not in kernels.KL_ESTIMATORS:
    fail("algorithm.kl_estimator", f"={a.kl_estimator!r} is not one of "
         f"{', '.join(kernels.KL_ESTIMATORS)}")
  if a.group_size < 1:
    fail("algorithm.group_size", f"={a.group_size} must be >= 1")
  if a.estimator in ppo_family.GROUP_ESTIMATORS and a.group_size < 2:
    fail("algorithm.group_size", f"={a.group_size} must be >= 2 for estimator {a.estimator!r}")
  if not 0 <= a.clip_low < 1:
    fail("algorithm.clip_low", f"={a.clip_low} must be in [0, 1)")
  if a.clip_high < a.clip_low:
    fail("algorithm.clip_high", f"={a.clip_high} must be >= clip_low={a.clip_low}")
  if a.dual_clip and a.dual_clip <= 1:
    fail("algorithm.dual_clip", f"={a.dual_clip} must be > 1 (or 0 for off)")
  for field in ("gamma", "actor_lam", "critic_lam"):
    if not 0 <= a[field] <= 1:
      fail(f"algorithm.{field}", f"={a[field]} must be in [0, 1]")
  if a.oversample < 1:
    fail("algorithm.oversample", f"={a.oversample} must be >= 1")
  if a.dynamic_sampling and a.group_size < 2:
    fail("algorithm.dynamic_sampling", "needs group_size >= 2 (it keeps groups whose "
         "correctness varies)")
  if a.value_pretrain_steps and not ppo_family.uses_critic(a):
    fail("algorithm.value_pretrain_steps", f"={a.value_pretrain_steps} needs a critic "
         "(estimator 'gae')")
  if a.window_tokens < 0:
    fail("algorithm.window_tokens", f"={a.window_tokens} must be >= 0 (0 = whole responses)")
  if a.window_tokens and not ppo_family.uses_critic(a):
    fail("algorithm.window_tokens", "(T-PPO) needs a critic (estimator 'gae') for Extended GAE")
  if a.window_tokens and a.dynamic_sampling:
    fail("algorithm.dynamic_sampling", "cannot be combined with algorithm.window_tokens "
         "(T-PPO scores responses one by one as they finish, not in groups)")
  if a.overlong_buffer and not 0 < a.overlong_buffer <= c.rollout.max_new_tokens:
    fail("algorithm.overlong_buffer", f"={a.overlong_buffer} must be in (0, "
         f"rollout.max_new_tokens={c.rollout.max_new_tokens}]")
  if a.kl_target < 0:
    fail("algorithm.kl_target", f"={a.kl_target} must be >= 0 (0 = fixed β)")
  if a.kl_target > 0 and a.kl_reward_coef <= 0:
    fail("algorithm.kl_target", "(adaptive KL controller) adapts kl_reward_coef, which is 0; "
         "set algorithm.kl_reward_coef > 0 as its initial β")
  if a.kl_horizon <= 0:
    fail("algorithm.kl_horizon", f"={a.kl_horizon} must be > 0")
  if not 0 <= a.ref_ema <= 1:
    fail("algorithm.ref_ema", f"={a.ref_ema} must be in [0, 1]")
  if a.ref_ema and not ppo_family.uses_reference(a):
    fail("algorithm.ref_ema", "needs a KL term (kl_loss_coef or kl_reward_coef > 0)")
  for field in ("kl_loss_coef", "kl_reward_coef", "entropy_coef", "positive_nll_coef",
                "value_clip"):
    if a[field] < 0:
      fail(f"algorithm.{field}", f"={a[field]} must be >= 0")
  r = c.rollout
  if r.prompts_per_step < 1:
    fail("rollout.prompts_per_step", f"={r.prompts_per_step} must be >= 1")
  if r.max_new_tokens < 1:
    fail("rollout.max_new_tokens", f"={r.max_new_tokens} must be >= 1")
  rows = r.prompts_per_step * a.group_size
  if rows % c.train.minibatches:
    fail("train.minibatches", f"={c.train.minibatches} must divide the "
         f"{rows} rollouts per step (prompts_per_step × group_size)")
  for field in ("steps", "ppo_epochs", "minibatches", "eval_every", "checkpoint_every",
                "log_every"):
    if c.train[field] < 1:
      fail(f"train.{field}", f"={c.train[field]} must be >= 1")
  sampler_config_lib.validate_sampler_config(c.sampler)
  if c.data.prompt_length > max(c.sampler.prompt_buckets):
    fail("data.prompt_length", f"={c.data.prompt_length} exceeds the largest "
         f"sampler.prompt_buckets={max(c.sampler.prompt_buckets)}")
  if a.window_tokens:
    # A continued response is re-sent as prompt + tokens so far.
    longest = windowed.longest_request_prompt(c.data.prompt_length, r.max_new_tokens,
                                              a.window_tokens)
    if longest > max(c.sampler.prompt_buckets):
      fail("sampler.prompt_buckets", f"={tuple(c.sampler.prompt_buckets)} must reach "
           f"{longest} tokens with algorithm.window_tokens={a.window_tokens} (a continued "
           "response is sent as prompt + the tokens so far)")
  if c.data.prompt_length + r.max_new_tokens > c.sampler.cache_length:
    fail("sampler.cache_length", f"={c.sampler.cache_length} is below data.prompt_length + "
         f"rollout.max_new_tokens = {c.data.prompt_length + r.max_new_tokens}")
  if c.variant == "hf" and not c.model.checkpoint:
    fail("model.checkpoint", "is required for the hf variant (an HF checkpoint directory)")
  if c.variant == "hf" and not c.data.train_file:
    fail("data.train_file", "is required for the hf variant (JSONL: prompt, answer, task)")
  if len(c.data.levels) != len(c.data.level_weights):
    fail("data.level_weights", f"has {len(c.data.level_weights)} entries for "
         f"{len(c.data.levels)} data.levels")
  sizes = [c.mesh.data, c.mesh.fsdp, c.mesh.tensor]
  if num_devices is not None and -1 not in sizes and sizes[0] * sizes[1] * sizes[2] > num_devices:
    fail("mesh", f"data×fsdp×tensor = {sizes[0] * sizes[1] * sizes[2]} exceeds the "
         f"{num_devices} available devices")
  if num_devices is not None:
    try:
      resolved = parallel.resolve_axis_sizes(
          {"data": sizes[0], "fsdp": sizes[1], "tensor": sizes[2]},
          num_devices if -1 in sizes else sizes[0] * sizes[1] * sizes[2])
    except ValueError as error:
      fail("mesh", f"{dict(data=sizes[0], fsdp=sizes[1], tensor=sizes[2])}: {error}")
    batch_shards = resolved["data"] * resolved["fsdp"]
    if rows % batch_shards:
      fail("rollout.prompts_per_step", f"={r.prompts_per_step}: the {rows} rollouts per step "
           f"(× algorithm.group_size={a.group_size}) must split evenly over mesh "
           f"data×fsdp = {batch_shards}")
  if c.train.tensorboard and importlib.util.find_spec("tensorboardX") is None:
    fail("train.tensorboard", "=True needs tensorboardX: pip install 'rlhf-jax[tensorboard]' "
         "(or set it False; metrics.jsonl is always written)")
  if c.optimizer.learning_rate <= 0:
    fail("optimizer.learning_rate", f"={c.optimizer.learning_rate} must be > 0")
