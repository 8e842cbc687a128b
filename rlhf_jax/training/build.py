"""Building a run's parts from its config: mesh, models, roles, sampler, scorer, data,
rollout. The loop (training/loop.py) receives them ready to use."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.data import read_examples
from rlhf_jax.data.curriculum import CurriculumStream
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.rewards.router import router_for_tasks
from rlhf_jax.rewards import Scorer
from rlhf_jax.rollout import GroupGenerator
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import pycalc
from rlhf_jax.training import learner as learner_lib
from rlhf_jax.training.config import parse_columns
from rlhf_jax.training.roles import FrozenRole
from rlhf_jax.training.roles import make_optimizer
from rlhf_jax.training.sft import policy_checkpoint_dir


@dataclasses.dataclass
class Policy:
  """The initial policy as loaded: model (trainer numerics), params on the mesh,
  tokenizer and prompt prefix."""
  model: Any
  params: Any
  tokenizer: Any
  prefix: list[int]
  prefix_tokens: list[str]


def trainer_mesh(c) -> jax.sharding.Mesh:
  """The (data, fsdp, tensor) mesh of `config.mesh` over the first devices it needs
  (−1 takes the rest); the default 1×1×1 is one device."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "tensor": c.mesh.tensor}
  if -1 in sizes.values():
    sizes = parallel.resolve_axis_sizes(sizes, jax.device_count())
  count = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  return parallel.make_mesh(**sizes, devices=jax.devices()[:count])


def check_deterministic(c) -> None:
  """`train.deterministic` on a GPU needs XLA's flag set before JAX started."""
  flags = os.environ.get("XLA_FLAGS", "")
  if (c.train.deterministic and jax.default_backend() == "gpu"
      and "--xla_gpu_deterministic_ops=true" not in flags):
    raise ConfigError("config.train.deterministic=True needs XLA_FLAGS="
                      "--xla_gpu_deterministic_ops=true before JAX starts (launch/train.py "
                      "sets it; in your own program, export it first).")


def load_policy(c, workdir: str, mesh) -> Policy:
  """The initial policy from `model.checkpoint` (or the arith warm start in <workdir>/sft),
  computing in `model.dtype` at `model.matmul_precision`, params in the training layout."""
  directory = policy_checkpoint_dir(c, workdir)
  if not os.path.exists(os.path.join(directory, "config.json")):
    raise ConfigError(f"config.model.checkpoint: no policy checkpoint in {directory!r} "
                      "(for the arith variant run launch/sft.py, or launch/train.py, which "
                      "trains the warm start first)")
  model, params = models.load_hf_checkpoint(directory)
  model = models.with_numerics(model, dtype=c.model.dtype,
                               matmul_precision=c.model.matmul_precision)
  params = parallel.shard_params(params, parallel.param_shardings(
      params, model.logical_axes(), mesh))
  tokenizer = models.Tokenizer.from_directory(directory)
  prefix = models.load_prompt_prefix(directory, tokenizer)
  return Policy(model=model, params=params, tokenizer=tokenizer, prefix=prefix,
                prefix_tokens=[tokenizer.backend.id_to_token(i) for i in prefix])


GENERATED = {arith.TASK: arith.examples, pycalc.TASK: pycalc.examples}


def load_examples(c) -> tuple[list[Example], list[Example]]:
  """Training and held-out examples (JSONL files, or generated `data.task` problems)."""
  levels, weights = tuple(c.data.levels), tuple(c.data.level_weights)
  generate = GENERATED[c.data.task]
  columns = parse_columns(c.data.columns)
  if c.data.train_file:
    train = read_examples(c.data.train_file, columns=columns)
  else:  # generated arith problems; an hf run on offline data needs no prompts
    train = generate(c.seed + 1, c.data.num_train, levels, weights) if c.variant == "arith" else []
  if c.data.eval_file:
    held_out = read_examples(c.data.eval_file, columns=columns)
  else:
    held_out = (generate(c.seed + 2, c.data.num_eval, levels, weights)
                if c.variant == "arith" else [])
  return train, held_out


def build_scorer(c, tasks: Sequence[str], mesh=None) -> Scorer:
  """The run's reward (`reward.route`): the rule verifiers of `tasks` (`build_verifiers`)
  by default, else reward models and judges routed per sample, and a PRM's step
  rewards with `reward.process.checkpoint` (training/reward_models.py). Models load
  onto `mesh` (default: the trainer mesh of the config)."""
  if c.reward.route == "verifier" and not c.reward.process.checkpoint:
    return build_verifiers(c, tasks)
  from rlhf_jax.training import reward_models  # pylint: disable=import-outside-toplevel
  return reward_models.build_reward(c, tasks, mesh if mesh is not None else trainer_mesh(c),
                                    lambda subset: build_verifiers(c, subset))


def build_verifiers(c, tasks: Sequence[str]) -> RewardRouter:
  """The `reward` section's router over the rule verifiers and sandbox the data's `tasks`
  need (`rewards.router.router_for_tasks`); a missing dependency or a sandbox that
  cannot start is a ConfigError here, before anything compiles."""
  from rlhf_jax.rewards.sandbox import SandboxUnavailable  # pylint: disable=import-outside-toplevel
  r = c.reward
  try:
    return router_for_tasks(
        tasks, correct_score=r.correct_score, wrong_score=r.wrong_score,
        failure_score=r.failure_score, timeout_s=r.timeout_s, workers=r.workers,
        math_extractor=r.math_extractor, sandbox_timeout_s=r.sandbox.timeout_s,
        sandbox_memory_mb=r.sandbox.memory_mb, sandbox_workers=r.sandbox.workers or None,
        sandbox_isolation=r.sandbox.isolation)
  except ImportError as error:
    raise ConfigError(f"the data has a 'math' task: {error}") from None
  except ValueError as error:
    raise ConfigError(f"config.reward.math_extractor: {error}") from None
  except SandboxUnavailable as error:
    raise ConfigError(f"config.reward.sandbox.isolation={r.sandbox.isolation!r}: "
                      f"{error}") from None


def generation_params(c, policy: Policy, params, mesh):
  """The policy in the sampler's layout (GENERATE_RULES: replicated over data and fsdp,
  split over tensor); a server gets host arrays anyway."""
  if c.sampler.address:
    return params
  return parallel.reshard(params, parallel.param_shardings(
      params, policy.model.logical_axes(), mesh, parallel.GENERATE_RULES))


def build_sampler(c, policy: Policy, mesh):
  """The in-process scheduler (sampler section), or a client of `sampler.address`
  that is sent the initial weights before the first rollout."""
  if c.sampler.address:
    from rlhf_jax.sampling.client import SamplerClient
    sampler = SamplerClient(c.sampler.address)
    sampler.wait_ready()
    sampler.update_params(policy.params, version=0)
    return sampler
  return sampler_config_lib.build_scheduler(
      c.sampler, policy.model, generation_params(c, policy, policy.params, mesh),
      tokenizer=policy.tokenizer, seed=c.seed)


def build_rollout(c, policy: Policy, sampler, scorer: Scorer, examples: list[Example], *,
                  workdir: str = "", log=print):
  """The rollout of `rollout.mode` over a resumable stream of `examples` (mode 'offline':
  over the labelled groups of `data.offline_file`, training/offline_data.py)."""
  if c.rollout.mode == "offline":
    from rlhf_jax.training.offline_data import offline_rollout  # pylint: disable=import-outside-toplevel
    return offline_rollout(c, policy, workdir, log=log)
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  step_ends = None
  if c.reward.process.checkpoint:
    from rlhf_jax.training.reward_models import step_ends_of  # pylint: disable=import-outside-toplevel
    step_ends = step_ends_of(c, policy.tokenizer)
  generator = GroupGenerator(sampler, scorer, policy.tokenizer,
                             sampling=rollout_config_lib.sampling_params(c.rollout, stop),
                             prefix=policy.prefix, prompt_length=c.data.prompt_length,
                             seed=c.seed, step_end_ids=step_ends)
  if c.data.curriculum:
    stream = CurriculumStream(examples, parse_curriculum(c.data.curriculum), seed=c.seed,
                              shuffle=c.data.shuffle)
  else:
    stream = PromptStream(examples, seed=c.seed, shuffle=c.data.shuffle)
  return rollout_config_lib.build_rollout(c.rollout, generator, stream)


def _optimizers(c):
  """(actor, critic) optimizers of the `optimizer` section, decaying over the run's updates
  when the schedule is cosine."""
  o = c.optimizer
  decay = dict(decay_updates=(c.train.steps * c.train.ppo_epochs * c.train.minibatches
                              if o.schedule == "cosine" else 0),
               final_fraction=o.final_fraction)
  return (make_optimizer(o.learning_rate, o.warmup_steps, o.weight_decay, o.max_grad_norm,
                         **decay),
          make_optimizer(o.critic_learning_rate, o.warmup_steps, 0.0, o.max_grad_norm, **decay))


def _critic(c, policy: Policy, mesh):
  """(critic model, params on the mesh): from `critic.init_from` (a PRM) or the policy's
  backbone with a zero value head."""
  if c.critic.init_from:
    from rlhf_jax.training import reward_models  # pylint: disable=import-outside-toplevel
    critic_model, critic_params = reward_models.critic_from_checkpoint(c.critic.init_from,
                                                                       policy.model)
  else:
    critic_model, critic_params = models.critic_from_policy(policy.model, policy.params)
  # A copy: the actor's update donates (frees) the backbone arrays they share.
  critic_params = parallel.shard_params(jax.tree.map(lambda x: x.copy(), critic_params),
                                        parallel.param_shardings(
                                            critic_params, critic_model.logical_axes(), mesh))
  return critic_model, critic_params


def build_learner(c, policy: Policy, mesh):
  """The learner of `algorithm.learner`: the PPO family's (actor, critic with estimator
  'gae', reference with a KL term), DPO's (actor, reference) or DQO's (policy, value,
  reference), with their optimizers."""
  a = c.algorithm
  actor_optimizer, critic_optimizer = _optimizers(c)
  if a.learner == "dpo":
    from rlhf_jax.training import dpo_learner  # pylint: disable=import-outside-toplevel
    actor = dpo_learner.dpo_actor_role(policy.model, policy.params, actor_optimizer, mesh,
                                       a.dpo, c.train)
    reference = None if a.dpo.reference == "cached" else FrozenRole(policy.model,
                                                                     policy.params)
    return dpo_learner.DPOLearner(a.dpo, actor, reference, group_size=c.rollout.group_size,
                                  seed=c.seed)
  if a.learner == "dqo":
    from rlhf_jax.training import dqo_learner  # pylint: disable=import-outside-toplevel
    critic_model, critic_params = _critic(c, policy, mesh)
    actor, critic = dqo_learner.dqo_roles(policy.model, policy.params, critic_model,
                                          critic_params, (actor_optimizer, critic_optimizer),
                                          mesh, a.dqo, c.train)
    reference = None if a.dqo.reference == "cached" else FrozenRole(policy.model,
                                                                     policy.params)
    return dqo_learner.DQOLearner(a.dqo, actor, critic, reference, seed=c.seed)
  actor = learner_lib.actor_role(policy.model, policy.params, actor_optimizer, mesh, a,
                                 c.train)
  critic = None
  if ppo_config.uses_critic(a):
    critic_model, critic_params = _critic(c, policy, mesh)
    critic = learner_lib.critic_role(critic_model, critic_params, critic_optimizer, mesh, a,
                                     c.train)
  reference = FrozenRole(policy.model, policy.params) if ppo_config.uses_reference(a) else None
  correction = ppo_config.correction_mode(a, trainer_dtype=c.model.dtype,
                                          sampler_dtype=c.sampler.dtype)
  return learner_lib.PPOLearner(a, actor, critic, reference, correction=correction,
                                group_size=c.rollout.group_size, seed=c.seed)
