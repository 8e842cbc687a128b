"""The trainer's config: one schema for every preset, and its validation.

configs/{ppo,grpo,dapo,vcppo,vapo,tppo}.py start from `base_config(variant)` and
change fields of the `algorithm` sub-sections and `rollout`. Each section is
defined and validated by the module that owns it (algorithms/ppo_config.py,
rollout/config.py, sampling/config.py); `validate_config` runs them all, plus the
checks that span sections, before anything loads or compiles. Every error is a
`ConfigError` naming the full field path.
"""

from __future__ import annotations

import importlib.util

import ml_collections

from rlhf_jax import parallel
from rlhf_jax.algorithms import dpo
from rlhf_jax.algorithms import dqo
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.config_errors import fail
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.data.sources import FIELDS as SOURCE_FIELDS
from rlhf_jax.models.config import DTYPES
from rlhf_jax.models.config import MATMUL_PRECISIONS
from rlhf_jax.rewards import config as reward_config_lib
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.sampling import config as sampler_config_lib

VARIANTS = ("arith", "hf")
LEARNERS = ("ppo", "dpo", "dqo")
GENERATED_TASKS = ("arith", "pycalc")  # data.task of the arith variant
MATH_EXTRACTORS = ("auto", "boxed", "answer_line", "gsm8k", "last_number")


def base_config(variant: str) -> ml_collections.ConfigDict:
  """Every field with its default; presets override the `algorithm` and `rollout` sections."""
  if variant not in VARIANTS:
    raise ValueError(f"config variant {variant!r}; allowed: {', '.join(VARIANTS)}.")
  arith = variant == "arith"
  c = ml_collections.ConfigDict()
  c.variant = variant  # 'arith' (built-in task, tiny model) or 'hf' (your checkpoint and JSONL).
  c.seed = 0  # Seeds model init (arith), data order, sampling, mini-batch shuffles.

  c.model = ml_collections.ConfigDict()
  c.model.checkpoint = ""  # HF directory of the initial policy; arith: empty = <workdir>/sft.
  c.model.dtype = "float32"  # Trainer compute dtype (float32, bfloat16); params stay float32.
  # Matmul precision of the trainer's model: 'auto' (highest for float32, the backend
  # default for bfloat16), 'default' (TF32 on NVIDIA GPUs), 'high', 'highest'.
  c.model.matmul_precision = "auto"
  c.model.hidden_size = 128  # arith tiny model: width.
  c.model.num_layers = 3  # arith tiny model: layers.
  c.model.num_heads = 4  # arith tiny model: query heads.

  c.data = ml_collections.ConfigDict()
  c.data.train_file = ""  # .jsonl/.parquet of prompts (prompt, answer, task); arith: empty = generated.
  c.data.eval_file = ""  # Held-out prompts, same formats; arith: empty = generated (other seeds).
  # Other schemas: our field = the file's dotted column, e.g. verl's Parquet layout
  # "answer=reward_model.ground_truth,task=data_source" (a chat-list prompt becomes messages).
  c.data.columns = ""
  # Task schedule (data/curriculum.py), e.g. "math:1,code:1@50; math:1,code:1,arith:2":
  # per phase the tasks' shares of each step's prompts; empty: the file's mix, shuffled.
  c.data.curriculum = ""
  # arith variant: the built-in task of the generated problems: 'arith' (worked
  # solutions, verified by the answer line) or 'pycalc' (a program run in the sandbox).
  c.data.task = "arith"
  c.data.levels = (1, 2)  # arith difficulty levels of generated problems.
  c.data.level_weights = (1.0, 1.0)  # arith: sampling weight of each level.
  c.data.num_train = 20000  # arith: generated training prompts.
  c.data.num_eval = 256  # arith: generated held-out prompts (eval every eval_every steps).
  c.data.prompt_length = 64 if arith else 512  # P: prompt tokens (left-padded; longer = error).
  c.data.shuffle = True  # Shuffle the prompts each epoch (False: file order).
  # rollout.mode 'offline' (DPO, DQO): .jsonl/.parquet of labelled samples (prompt,
  # responses, scores) or pairs (prompt, chosen, rejected); arith: empty = labelled
  # samples of the warm start written to <workdir>/offline.jsonl first (the same as
  # launch/label_samples.py).
  c.data.offline_file = ""
  c.data.offline_prompts = 2000  # Labelled samples: training prompts sampled ...
  c.data.offline_samples = 8  # ... and responses per prompt (the SFT policy's, verified).

  c.sft = ml_collections.ConfigDict()  # arith warm start (launch/sft.py, or train.py when missing)
  c.sft.steps = 450  # SFT steps.
  c.sft.batch_size = 64  # Problems per SFT step.
  c.sft.learning_rate = 3e-3  # Peak AdamW learning rate (warmup 20 steps, cosine to 10%).
  c.sft.levels = (1, 2)  # Difficulty levels of the SFT problems.
  c.sft.level_weights = (1.0, 2.0)  # Their weights (the harder level heavier).
  # Fraction of SFT demonstrations that give only "Answer: N" instead of the worked
  # digit-serial solution (a style RL can switch away from); 0 = worked solutions only.
  c.sft.direct_fraction = 0.0
  # Probability that the SFT teacher drops a carry or borrow coming into a line of its
  # worked solution (tasks/arith.py, slipped_solution). Above 0.5 the student's greedy
  # solutions drop every carry, a habit of reasoning the verifier's reward can correct
  # (the README's demo); 0 = a flawless teacher.
  c.sft.carry_slip = 0.6

  c.rollout = rollout_config_lib.rollout_config(prompts_per_step=16 if arith else 128,
                                                max_new_tokens=64 if arith else 1024)
  c.sampler = sampler_config_lib.sampler_config(
      num_slots=64 if arith else 256, cache_length=(64 + 64) if arith else 1536,
      prompt_buckets=(64,) if arith else (512,))

  c.reward = ml_collections.ConfigDict()
  c.reward.correct_score = 1.0  # Reward of a verified answer (DAPO: +1).
  c.reward.wrong_score = -1.0  # Reward of a wrong answer (DAPO: −1).
  c.reward.failure_score = -1.0  # Reward when the verifier raises or times out.
  c.reward.timeout_s = 5.0  # Per-sample rule-verifier time limit (arith, math).
  c.reward.workers = 2  # Rule-verifier worker processes (killed and replaced when they hang).
  # Math answers (task 'math', rewards/math.py): where the final answer is: 'auto'
  # (\boxed{}, else an "Answer:" line, else GSM8K's "#### N"), 'boxed', 'answer_line',
  # 'gsm8k', 'last_number', or 're:<regex with one group>'.
  c.reward.math_extractor = "auto"
  c.reward.sandbox = ml_collections.ConfigDict()  # code tasks ('code', 'pycalc'): rewards/code.py
  c.reward.sandbox.timeout_s = 5.0  # Wall clock (and CPU seconds) per program.
  c.reward.sandbox.memory_mb = 512  # Address space per program.
  c.reward.sandbox.workers = 0  # Concurrent sandboxes (0: 4 per core).
  # 'namespaces' (bubblewrap: no network, private /tmp, own PID namespace) or 'rlimits'
  # (machines without user namespaces; weaker, see docs/sandbox.md).
  c.reward.sandbox.isolation = "namespaces"
  reward_config_lib.add_reward_model_fields(  # route, rm, genrm, pairwise, process
      c.reward, judge_prompt_buckets=(128, 256) if arith else (2048, 3072))

  c.algorithm = ppo_config.algorithm_config()
  # The learner: 'ppo' (the PPO family, by the sections above), 'dpo' (algorithm.dpo) or
  # 'dqo' (algorithm.dqo).
  c.algorithm.learner = "ppo"
  c.algorithm.dpo = dpo.dpo_config()
  c.algorithm.dqo = dqo.dqo_config()

  c.critic = ml_collections.ConfigDict()
  # HF directory of a scalar-head model (a PRM: launch/train_prm.py) whose weights start
  # the critic (Dai et al.); empty: the policy's backbone with a zero value head.
  c.critic.init_from = ""

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 2e-4 if arith else 1e-6  # Actor peak learning rate.
  c.optimizer.warmup_steps = 5 if arith else 20  # Linear warmup in updates (DAPO: 20), then:
  # 'constant' (DAPO §4.1) or 'cosine' (down to final_fraction × the rate at the last
  # update of train.steps).
  c.optimizer.schedule = "constant"
  c.optimizer.final_fraction = 0.1
  c.optimizer.weight_decay = 0.0  # AdamW weight decay (DAPO script: 0.1).
  c.optimizer.max_grad_norm = 1.0  # Global-norm gradient clipping.
  c.optimizer.critic_learning_rate = 1e-3 if arith else 1e-5  # Critic peak learning rate.

  c.train = ml_collections.ConfigDict()
  c.train.steps = 60 if arith else 1000  # Training steps (one rollout batch each).
  c.train.ppo_epochs = 1  # Passes over each rollout batch.
  c.train.minibatches = 2  # Optimizer steps per epoch (the batch split evenly).
  c.train.micro_batches = 1  # Gradient-accumulation slices per optimizer step (same update).
  # XLA's deterministic GPU ops (--xla_gpu_deterministic_ops): exact resume on GPU, at the
  # cost of slower scatter / reduction kernels. CPU runs are deterministic either way.
  c.train.deterministic = False
  c.train.eval_every = 10 if arith else 50  # Held-out greedy accuracy every N steps (and at
  # start and end).
  # Sampled held-out accuracy and pass@k at each evaluation: samples per prompt (0: off).
  c.train.eval_samples = 4 if arith else 0
  c.train.checkpoint_every = 20  # Save a checkpoint every N steps (and at the end).
  c.train.log_every = 1  # Console progress line every N steps.
  c.train.tensorboard = True  # Also write TensorBoard event files (needs the tensorboard extra).
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # Mesh axis sizes (product ≤ devices; -1 takes the rest).
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return c


def sibling_preset(preset_file: str, name: str, variant: str) -> ml_collections.ConfigDict:
  """`get_config(variant)` of configs/<name>.py beside `preset_file` (a preset built on
  another, e.g. Pairwise-PPO on PPO), loaded by path: presets are files, not a package."""
  import importlib.util  # pylint: disable=import-outside-toplevel,redefined-outer-name
  import os  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.abspath(preset_file)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"rlhf_jax_preset_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def validate_config(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ConfigError naming the field of an impossible setting (before any compile)."""
  if c.variant not in VARIANTS:
    fail("variant", f"={c.variant!r} is not one of {', '.join(VARIANTS)}")
  r, a = c.rollout, c.algorithm
  sampler_config_lib.validate_sampler_config(c.sampler)
  ppo_config.validate_algorithm_config(a, group_size=r.group_size,
                                       response_length=r.max_new_tokens)
  if r.mode == "windows" and not ppo_config.uses_critic(a):
    fail("rollout.mode", "='windows' (T-PPO) needs a critic (algorithm.advantage.estimator "
         "'gae') for Extended GAE")
  _validate_learner(c)
  rollout_config_lib.validate_rollout_config(r, prompt_length=c.data.prompt_length,
                                             prompt_buckets=tuple(c.sampler.prompt_buckets))
  _validate_model(c.model)
  _validate_reward(c)
  reward_config_lib.validate_reward_models(c)
  _validate_train(c, rows=r.prompts_per_step * r.group_size)
  _validate_sft(c.sft)
  _validate_schedule(c.optimizer)
  if c.data.prompt_length > max(c.sampler.prompt_buckets):
    fail("data.prompt_length", f"={c.data.prompt_length} exceeds the largest "
         f"sampler.prompt_buckets={max(c.sampler.prompt_buckets)}")
  if c.data.prompt_length + r.max_new_tokens > c.sampler.cache_length:
    fail("sampler.cache_length", f"={c.sampler.cache_length} is below data.prompt_length + "
         f"rollout.max_new_tokens = {c.data.prompt_length + r.max_new_tokens}")
  if c.variant == "hf" and not c.model.checkpoint:
    fail("model.checkpoint", "is required for the hf variant (an HF checkpoint directory)")
  if c.variant == "hf" and not c.data.train_file and r.mode != "offline":
    fail("data.train_file", "is required for the hf variant (JSONL: prompt, answer, task)")
  parse_columns(c.data.columns)
  if c.data.curriculum:
    parse_curriculum(c.data.curriculum)
  if len(c.data.levels) != len(c.data.level_weights):
    fail("data.level_weights", f"has {len(c.data.level_weights)} entries for "
         f"{len(c.data.levels)} data.levels")
  if num_devices is not None:
    _validate_mesh(c, num_devices, rows=r.prompts_per_step * r.group_size)
  if c.train.tensorboard and importlib.util.find_spec("tensorboardX") is None:
    fail("train.tensorboard", "=True needs tensorboardX: pip install 'rlhf-jax[tensorboard]' "
         "(or set it False; metrics.jsonl is always written)")
  for field in ("learning_rate", "critic_learning_rate"):
    if c.optimizer[field] <= 0:
      fail(f"optimizer.{field}", f"={c.optimizer[field]} must be > 0")


def parse_columns(text: str) -> dict[str, str]:
  """`data.columns` ("answer=reward_model.ground_truth,task=data_source") as a mapping."""
  mapping = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    field, _, path = item.partition("=")
    if field.strip() not in SOURCE_FIELDS or not path.strip():
      fail("data.columns", f"={text!r}: {item!r} is not field=column with field one of "
           f"{', '.join(SOURCE_FIELDS)}")
    mapping[field.strip()] = path.strip()
  return mapping


def _validate_reward(c) -> None:
  from rlhf_jax.rewards import sandbox  # pylint: disable=import-outside-toplevel
  if c.data.task not in GENERATED_TASKS:
    fail("data.task", f"={c.data.task!r} is not one of {', '.join(GENERATED_TASKS)}")
  r = c.reward
  if r.timeout_s <= 0 or r.sandbox.timeout_s <= 0:
    fail("reward.timeout_s" if r.timeout_s <= 0 else "reward.sandbox.timeout_s", "must be > 0")
  if r.workers < 1:
    fail("reward.workers", f"={r.workers} must be >= 1")
  if r.sandbox.workers < 0:
    fail("reward.sandbox.workers", f"={r.sandbox.workers} must be >= 0 (0: 4 per core)")
  if r.sandbox.memory_mb < 64:
    fail("reward.sandbox.memory_mb", f"={r.sandbox.memory_mb} must be >= 64")
  if r.sandbox.isolation not in sandbox.ISOLATIONS:
    fail("reward.sandbox.isolation", f"={r.sandbox.isolation!r} is not one of "
         f"{', '.join(sandbox.ISOLATIONS)}")
  extractor = r.math_extractor
  if not (extractor in MATH_EXTRACTORS or extractor.startswith("re:")):
    fail("reward.math_extractor", f"={extractor!r} is not one of {', '.join(MATH_EXTRACTORS)} "
         "or 're:<regex>'")


def _validate_learner(c) -> None:
  a, r = c.algorithm, c.rollout
  if a.learner not in LEARNERS:
    fail("algorithm.learner", f"={a.learner!r} is not one of {', '.join(LEARNERS)}")
  if a.learner == "dpo":
    dpo.validate_dpo_config(a.dpo, rollout_mode=r.mode, group_size=r.group_size,
                            prompts_per_step=r.prompts_per_step,
                            minibatches=c.train.minibatches)
    if (r.prompts_per_step // c.train.minibatches) % c.train.micro_batches:
      fail("train.micro_batches", f"={c.train.micro_batches} must divide the "
           f"{r.prompts_per_step // c.train.minibatches} pairs of a mini-batch")
  if a.learner == "dqo":
    dqo.validate_dqo_config(a.dqo, rollout_mode=r.mode)
  if r.mode == "offline":
    if a.learner == "ppo":
      fail("rollout.mode", "='offline' trains on fixed data: it needs algorithm.learner "
           "'dpo' or 'dqo'")
    if not c.data.offline_file and c.variant != "arith":
      fail("data.offline_file", "is required for rollout.mode='offline' (labelled samples "
           "or pairs: launch/label_samples.py writes them)")
    for field in ("offline_prompts", "offline_samples"):
      if c.data[field] < 1:
        fail(f"data.{field}", f"={c.data[field]} must be >= 1")
    if a.learner == "dpo" and r.group_size != 2:
      fail("rollout.group_size", f"={r.group_size} must be 2 for offline DPO (each labelled "
           "group is reduced to its best and worst response)")
    if (a.learner == "dqo" and not c.data.offline_file
        and r.group_size != c.data.offline_samples):
      fail("rollout.group_size", f"={r.group_size} must equal data.offline_samples="
           f"{c.data.offline_samples} for DQO on the generated offline data (whole groups)")
  if a.learner != "ppo" and r.mode not in ("groups", "dynamic", "offline"):
    fail("rollout.mode", f"={r.mode!r}: algorithm.learner={a.learner!r} trains on whole "
         "responses (groups, dynamic or offline)")


def _validate_model(m) -> None:
  if m.dtype not in DTYPES:
    fail("model.dtype", f"={m.dtype!r} is not one of {', '.join(DTYPES)}")
  if m.matmul_precision not in MATMUL_PRECISIONS:
    fail("model.matmul_precision", f"={m.matmul_precision!r} is not one of "
         f"{', '.join(MATMUL_PRECISIONS)}")


def _validate_schedule(o) -> None:
  if o.schedule not in ("constant", "cosine"):
    fail("optimizer.schedule", f"={o.schedule!r} is not one of constant, cosine")
  if not 0.0 <= o.final_fraction <= 1.0:
    fail("optimizer.final_fraction", f"={o.final_fraction} must be in [0, 1]")


def _validate_sft(sft) -> None:
  if len(sft.levels) != len(sft.level_weights):
    fail("sft.level_weights", f"has {len(sft.level_weights)} entries for {len(sft.levels)} "
         "sft.levels")
  for field in ("direct_fraction", "carry_slip"):
    if not 0.0 <= sft[field] <= 1.0:
      fail(f"sft.{field}", f"={sft[field]} must be in [0, 1]")


def _validate_train(c, *, rows: int) -> None:
  for field in ("steps", "ppo_epochs", "minibatches", "micro_batches", "eval_every",
                "checkpoint_every", "log_every"):
    if c.train[field] < 1:
      fail(f"train.{field}", f"={c.train[field]} must be >= 1")
  if c.train.eval_samples < 0:
    fail("train.eval_samples", f"={c.train.eval_samples} must be >= 0 (0: no sampled eval)")
  if rows % c.train.minibatches:
    fail("train.minibatches", f"={c.train.minibatches} must divide the {rows} rollouts per "
         "step (rollout.prompts_per_step × rollout.group_size)")
  if (rows // c.train.minibatches) % c.train.micro_batches:
    fail("train.micro_batches", f"={c.train.micro_batches} must divide the "
         f"{rows // c.train.minibatches} rows of a mini-batch")


def _validate_mesh(c, num_devices: int, *, rows: int) -> None:
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "tensor": c.mesh.tensor}
  product = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  if -1 not in sizes.values() and product > num_devices:
    fail("mesh", f"data×fsdp×tensor = {product} exceeds the {num_devices} available devices")
  try:
    resolved = parallel.resolve_axis_sizes(sizes, num_devices if -1 in sizes.values()
                                           else product)
  except ValueError as error:
    fail("mesh", f"{sizes}: {error}")
  batch_shards = resolved["data"] * resolved["fsdp"]
  if rows % batch_shards:
    fail("rollout.prompts_per_step", f"={c.rollout.prompts_per_step}: the {rows} rollouts per "
         f"step (× rollout.group_size={c.rollout.group_size}) must split evenly over mesh "
         f"data×fsdp = {batch_shards}")
