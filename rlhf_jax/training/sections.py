"""The sections the trainer declares itself, and the rules across rooms.

The root's fields (`seed`, `compile_cache`), `train`, `mesh`, and `algorithm.learner` with
every registered learner's section are the trainer's own. The rules check fields of rooms
that cannot import each other (the algorithm against the rollout mode's response budget,
episodes against the estimator, the sampler's sizes against the prompt and response
budget, the learner against what it supports): each is a `Section` without fields, after
the sections it reads. training/config.py lists them all in its table.
"""

from __future__ import annotations

import functools
import math
import os

import ml_collections

from rlhf_jax import parallel
from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms.registry import LEARNERS
from rlhf_jax.algorithms.registry import learner_spec
from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.envs import config as env_config_lib
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.rollout import reference as reference_lib
from rlhf_jax.rollout import windows as rollout_windows
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import registry as task_registry


def run_fields() -> ml_collections.ConfigDict:
  """The fields at the config's root."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds model init (from scratch), data order, sampling, mini-batch shuffles.
  # Persistent XLA compilation cache: a second run loads its compiled programs instead
  # of compiling them again (runtime.enable_compile_cache); '' = off.
  c.compile_cache = "~/.cache/rlhf_jax/xla"
  return c


def learner_fields() -> ml_collections.ConfigDict:
  """`algorithm.learner`, and the `algorithm.<section>` of every registered learner (made
  when the config is built: a learner registered before `base_config()` has its section)."""
  a = ml_collections.ConfigDict()
  # The learner: 'ppo' (the PPO family, by the sections above), 'dpo' or 'dqo' (theirs),
  # or one registered with algorithms/registry.py's `register_learner`.
  a.learner = "ppo"
  for spec in LEARNERS.values():  # algorithm.<section> of every registered learner
    if spec.section is not None:
      a[spec.section] = spec.default_section()
  return a


def train_fields() -> ml_collections.ConfigDict:
  """The `train` section: the loop's schedule, evaluation, checkpoints and logging."""
  train = ml_collections.ConfigDict()
  train.steps = 1000  # Training steps (one rollout batch each).
  train.epochs = 1  # Passes over each rollout batch.
  train.minibatches = 2  # Optimizer steps per epoch (the batch split evenly).
  train.micro_batches = 1  # Gradient-accumulation slices per optimizer step (same update).
  # Pack the rows' real tokens into buffers for every forward of the PPO family's step
  # (models/packing.py): no compute on padding; micro-batches split rows by token count.
  # One's own SFT (launch/sft.py) packs its rows too.
  train.packing = True
  # XLA's deterministic GPU ops (--xla_gpu_deterministic_ops): exact resume on GPU, at the
  # cost of slower scatter / reduction kernels. CPU runs are deterministic either way.
  train.deterministic = False
  # Held-out greedy accuracy every N steps, at the start and the end; 0: no evaluation.
  train.eval_every = 50
  # Sampled held-out accuracy and pass@k at each evaluation: samples per prompt (0: off).
  train.eval_samples = 0
  train.checkpoint_every = 20  # Save a checkpoint every N steps (and at the end).
  train.log_every = 1  # Console progress line every N steps.
  train.log_rollouts = 0  # Samples per step written to <workdir>/rollouts.jsonl (0: none).
  return train


def mesh_fields() -> ml_collections.ConfigDict:
  """The `mesh` section: the device mesh's axis sizes."""
  mesh = ml_collections.ConfigDict()
  mesh.data = 1  # Mesh axis sizes (product ≤ devices; -1 takes the rest).
  mesh.fsdp = 1
  mesh.tensor = 1
  # Expert parallelism: a mixture of experts' experts split over this axis (it divides
  # the model's num_experts; a dense model needs 1), the batch rows too.
  mesh.expert = 1
  return mesh


def _rows(c) -> int:
  """The rollouts of one step: prompts × group size."""
  return c.rollout.prompts_per_step * c.rollout.group_size


def _check_finite(c, checking: Checking) -> None:
  """Every float in the config is finite (first: a NaN poisons every later check)."""
  del checking
  check_finite(c)


def _check_run(c, checking: Checking) -> None:
  """The root's fields."""
  del checking
  check_range("seed", c.seed, low=0, high=_SEED_MAX)


def _check_algorithm_fit(c, checking: Checking) -> None:
  """The `algorithm` section against the rollout's group size and response budget, and a
  critic where the mode's windows need one."""
  del checking
  ppo_config.validate_algorithm_config(c.algorithm, group_size=c.rollout.group_size,
                                       response_length=rollout_modes.response_length(c))
  if (mode := rollout_modes.rollout_mode(c)).needs_critic and not ppo_config.uses_critic(
      c.algorithm):
    invalid("rollout.mode", mode.name, "T-PPO's windows need a critic for Extended GAE "
            "(algorithm.advantage.estimator 'gae')")


def _check_learner(c, checking: Checking) -> None:
  """`algorithm.learner` and the registered learners' sections, and what the picked
  learner supports."""
  _validate_learner_sections(c)
  _validate_learner(c, labelling=checking.labelling)


def _check_episodes(c, checking: Checking) -> None:
  """A run of episodes: the environment's factory and the sections that must fit it."""
  del checking
  if rollout_modes.rollout_mode(c).needs_environment:
    env_config_lib.validate_episodes(
        c, reads_token_rewards=ppo_config.reads_token_rewards(c.algorithm))


def _check_train(c, checking: Checking) -> None:
  del checking
  validate_train(c, rows=_rows(c))


def _check_mesh(c, checking: Checking) -> None:
  validate_mesh(c, checking.num_devices, rows=_rows(c))


def _check_sampler_sizes(c, checking: Checking) -> None:
  del checking
  fit_sampler_sizes(c)


def _check_across_sections(c, checking: Checking) -> None:
  _validate_across_sections(c, supervised=checking.supervised)


def _validate_across_sections(c, *, supervised: bool) -> None:
  r = c.rollout
  _validate_estimator_inputs(c)
  builtin = task_registry.builtin_run(c.data.task)
  run_rules = builtin.validate_run if builtin is not None else None
  if run_rules is not None:
    run_rules(c, rollout_modes.rollout_mode(c))
  remote = c.sampler.address or c.sampler.addresses
  reference_lib.check_config(c, uses_reference=ppo_config.uses_reference(c.algorithm),
                             remote=bool(remote),
                             sampler_reference=learner_spec(c).sampler_reference)
  if c.sampler.record_routes:
    invalid("sampler.record_routes", True, "is the sampling server's switch; a trainer's "
            "sampler records routes when algorithm.moe.routing_replay='R3'")
  if r.partial_rollouts and not remote and c.sampler.update_policy != "swap_now":
    invalid("sampler.update_policy", c.sampler.update_policy, "must be 'swap_now' with "
            "rollout.partial_rollouts=True (samples in flight take the new weights)")
  mode = rollout_modes.rollout_mode(c)
  moe = c.algorithm.moe
  if not supervised and not mode.carries_routes and (moe.routing_replay == "R3"
                                                     or moe.measure_route_flips):
    field = ("routing_replay" if moe.routing_replay == "R3" else "measure_route_flips")
    invalid(f"algorithm.moe.{field}", moe[field], f"rollout.mode={mode.name!r} does not "
            "carry the sampler's routes (the 'groups', 'dynamic' and 'multi_turn' modes do); "
            "R2 replays "
            "the trainer's own routes in every mode")
  if not supervised and mode.filters_groups and distillation.is_pure_distillation(c.algorithm):
    # The teacher's per-token term is nonzero in every group: "keep the groups whose
    # reward varies" filters on a reward that trains nothing.
    invalid("rollout.mode", mode.name, "must not filter groups (dynamic sampling) with pure "
            "distillation (algorithm.distill.task_coef=0): every group carries the teacher's "
            "signal; use 'groups', or a task term (algorithm.distill.task_coef > 0)")
  if c.reward.function and c.reward.unscored == "drop" and not supervised:
    _check_dropping_unscored(c, mode)
  if supervised and builtin is None and not c.sft.train_file:
    invalid("sft.train_file", c.sft.train_file, "a file of conversations or prompt/"
            "completion pairs is required for SFT on one's own data (data.task empty)")
  if supervised:
    return
  if builtin is None and not c.model.checkpoint:
    invalid("model.checkpoint", c.model.checkpoint, "an HF checkpoint directory is required "
            "(or data.task: a built-in task's warm start, configs/<preset>.py:arith)")
  if builtin is None and not c.data.train_file and not rollout_modes.rollout_mode(c).fixed_data:
    invalid("data.train_file", c.data.train_file, "a prompt file (JSONL: prompt, answer, "
            "task) is required (or data.task: a built-in task's generated problems)")


def fit_sampler_sizes(c) -> None:
  """`sampler.cache_length` and `sampler.prompt_buckets` against every bound the run puts
  on them at once (`sampling.config.fit_sizes`: derived when 0 / (), else one error with
  the sizes that fit): a row holds data.prompt_length + the response budget (the
  mode's response columns: rollout.max_new_tokens, or env.max_tokens for episodes); the
  longest request is the prompt, a multi-turn conversation so far (data.prompt_length +
  env.max_tokens - 1) or a continued T-PPO response (prompt + whole windows)."""
  r, p = c.rollout, c.data.prompt_length
  mode = rollout_modes.rollout_mode(c)
  response = max(rollout_modes.response_length(c), r.max_new_tokens)
  budget = (f"env.max_tokens {c.env.max_tokens}" if mode.needs_environment else
            f"rollout.max_new_tokens {r.max_new_tokens}")
  longest = (p, f"data.prompt_length {p}")
  if mode.needs_environment:  # a later turn's prompt is the conversation so far
    longest = (p + c.env.max_tokens - 1, f"data.prompt_length {p} + env.max_tokens "
               f"{c.env.max_tokens} - 1 (a later turn's prompt is the conversation so far)")
  elif mode.name == "windows":  # a continued response is sent as prompt + tokens so far
    w = r.windows.window_tokens
    longest = (rollout_windows.longest_request_prompt(p, r.max_new_tokens, w),
               f"data.prompt_length {p} + the whole windows of rollout.windows.window_tokens "
               f"{w} below rollout.max_new_tokens {r.max_new_tokens} (a continued response "
               "is sent as prompt + the tokens so far)")
  sampler_config_lib.fit_sizes(c.sampler, prompt_length=p,
                               row=(p + response, f"data.prompt_length {p} + {budget}"),
                               longest_prompt=longest)


def _validate_estimator_inputs(c) -> None:
  """A PRM's step rewards reach only an estimator that reads per-token rewards; a critic
  started from a checkpoint needs an estimator with a critic."""
  a = c.algorithm
  if c.reward.process.checkpoint and not ppo_config.reads_token_rewards(a):
    readers = [n for n in estimators.names() if estimators.estimator(n).reads_token_rewards]
    invalid("reward.process.checkpoint", c.reward.process.checkpoint, "gives per-step "
            f"rewards, which algorithm.advantage.estimator={a.advantage.estimator!r} ignores; "
            f"use one of {', '.join(readers)} (or leave it empty)")
  if c.critic.init_from and not ppo_config.uses_critic(a):
    invalid("critic.init_from", c.critic.init_from, "must be empty without a critic "
            "(algorithm.advantage.estimator 'gae')")


def _validate_learner_sections(c) -> None:
  """`algorithm.learner` is registered and trains from `rollout.mode`; every registered
  learner's section in the config is checked alone (the picked one's must be there)."""
  spec = learner_spec(c)
  mode = rollout_modes.rollout_mode(c)
  fixed_data = mode.fixed_data
  if mode.name not in spec.rollout_modes and spec.name not in mode.learners:
    others = " or ".join(repr(s.name) for s in LEARNERS.values()
                         if mode.name in s.rollout_modes or s.name in mode.learners)
    invalid("rollout.mode", mode.name, f"trains on fixed data: it needs algorithm.learner {others}"
            if fixed_data else f"must be one of {', '.join(spec.rollout_modes)} for "
            f"algorithm.learner={spec.name!r}")
  for other in LEARNERS.values():
    if other.section is None or other.check_section is None:
      continue
    if other.section in c.algorithm:
      other.check_section(c.algorithm[other.section])
    elif other is spec:
      invalid(f"algorithm.{spec.section}", None, "missing: register the learner before "
              "base_config() builds the config")


# (spec feature, field, value that turns it off, what it is): a learner without the feature
# refuses a config that turns it on.
_FEATURES = (
    ("value_pretraining", "algorithm.value.pretrain_steps", 0, "value pretraining"),
    ("packing", "train.packing", False, "packed forwards"),
    ("lora", "model.lora_rank", 0, "LoRA adapters"),
    ("staleness", "rollout.max_staleness", 0, "stale samples (decoupled PPO corrects them)"),
)


def _validate_learner(c, *, labelling: bool) -> None:
  spec = learner_spec(c)
  fixed_data = rollout_modes.rollout_mode(c).fixed_data
  for feature, field, off, what in _FEATURES:
    value = functools.reduce(lambda section, key: section[key], field.split("."), c)
    if not getattr(spec, feature) and value != off:
      invalid(field, value, f"must be {off} for algorithm.learner={spec.name!r} "
              f"(it does not support {what})")
  if fixed_data:
    _validate_offline(c, labelling=labelling)
  if spec.validate is not None:
    spec.validate(c, fixed_data=fixed_data)


def _validate_offline(c, *, labelling: bool) -> None:
  path = c.data.offline_file
  if path and not labelling and not os.path.isfile(path):  # read after the warm start
    invalid("data.offline_file", path, "must be an existing .jsonl/.parquet file of labelled "
            "samples or pairs (or empty with data.task: the warm start's are written first)")
  if not c.data.offline_file and task_registry.builtin_run(c.data.task) is None:
    invalid("data.offline_file", c.data.offline_file, "labelled samples or pairs are "
            "required for rollout.mode='offline' (launch/label_samples.py writes them)")


_SEED_MAX = 2**32 - 1  # numpy and the sampler take 32-bit seeds


def check_finite(config: ml_collections.ConfigDict, prefix: str = "") -> None:
  """Every float field of `config` is finite, and so is every float in a tuple or list
  field, nested ones included (a NaN learning rate or weight poisons every step)."""
  def finite(value) -> bool:
    if isinstance(value, float):
      return math.isfinite(value)
    return not isinstance(value, (tuple, list)) or all(map(finite, value))
  for name, value in config.items():
    path = f"{prefix}{name}"
    if isinstance(value, ml_collections.ConfigDict):
      check_finite(value, f"{path}.")
    elif not finite(value):
      invalid(path, value, "must be finite")


def validate_train(c, *, rows: int) -> None:
  """`train.*`; `rows` = rollouts per step, split into mini- and micro-batches."""
  at_least(c.train, "train", ("steps", "epochs", "minibatches", "micro_batches",
                              "checkpoint_every", "log_every"))
  check_range("train.eval_every", c.train.eval_every, low=0,
              note="(0: no held-out evaluation)")
  check_range("train.eval_samples", c.train.eval_samples, low=0, note="(0: no sampled eval)")
  check_range("train.log_rollouts", c.train.log_rollouts, low=0, note="(0: none)")
  if rows % c.train.minibatches:
    invalid("train.minibatches", c.train.minibatches, f"must divide the {rows} rollouts per "
            "step (rollout.prompts_per_step × rollout.group_size)")
  if (rows // c.train.minibatches) % c.train.micro_batches:
    invalid("train.micro_batches", c.train.micro_batches, "must divide the "
            f"{rows // c.train.minibatches} rows of a mini-batch")


def validate_mesh(c, num_devices: int | None, *, rows: int) -> None:
  """`mesh.*`: axis sizes; with `num_devices`, that they fit and split the batch evenly
  (the expert axis against the model's experts: `training.build.check_expert_axis`)."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "expert": c.mesh.expert,
           "tensor": c.mesh.tensor}
  for axis, size in sizes.items():
    if size < 1 and size != -1:
      invalid(f"mesh.{axis}", size, "must be >= 1, or -1 (the devices left)")
  if list(sizes.values()).count(-1) > 1:
    invalid("mesh", sizes, "at most one axis may be -1")
  if num_devices is None:
    return
  product = math.prod(sizes.values())
  if -1 not in sizes.values() and product > num_devices:
    invalid("mesh", sizes, f"data×fsdp×expert×tensor = {product} must be <= the "
            f"{num_devices} available devices")
  try:
    resolved = parallel.resolve_axis_sizes(sizes, num_devices if -1 in sizes.values()
                                           else product)
  except ValueError as error:
    invalid("mesh", sizes, str(error).rstrip("."))
  batch_shards = resolved["data"] * resolved["fsdp"] * resolved["expert"]
  if rows % batch_shards:
    invalid("rollout.prompts_per_step", c.rollout.prompts_per_step, f"the {rows} rollouts "
            f"per step (× rollout.group_size={c.rollout.group_size}) must split evenly over "
            f"mesh data×fsdp×expert = {batch_shards}")


def _check_dropping_unscored(c, mode) -> None:
  """`reward.unscored = "drop"` needs rows that carry the reward functions' verdicts
  straight to the batch: a rollout mode of whole-response groups (the route is the reward
  section's own rule: rewards/config.py)."""
  if not mode.drops_unscored:
    invalid("reward.unscored", "drop", f"works with rollout.mode 'groups' or 'dynamic', not "
            f"{mode.name!r} (use 'zero' or 'failure')")


# ------------------------------------------------------------------ the declarations

# A rule over every float field of every section (the one check that reads them all).
FINITE = Section("finite", check=_check_finite)
RUN = Section("run", at="", fields=run_fields, check=_check_run)
LEARNER = Section("learner", at="algorithm", fields=learner_fields, check=_check_learner,
                  after=("algorithm fit", "rollout mode", "data", "model", "train"))
TRAIN = Section("train", at="train", fields=train_fields, check=_check_train,
                after=("rollout",))
MESH = Section("mesh", at="mesh", fields=mesh_fields, check=_check_mesh,
               after=("rollout", "train"))
RULES = (
    Section("algorithm fit", check=_check_algorithm_fit,
            after=("algorithm", "rollout mode", "env")),
    Section("episodes", check=_check_episodes,
            after=("env", "rollout mode", "algorithm fit", "reward")),
    Section("sampler sizes", check=_check_sampler_sizes,
            after=("sampler", "data", "rollout mode", "env")),
)


def across_sections(names: tuple[str, ...]) -> Section:
  """The rules that read most sections (the learner's data, the run's checkpoint, the
  reference's placement, dropped unscored samples), after every section in `names`."""
  return Section("across sections", check=_check_across_sections, after=names)
