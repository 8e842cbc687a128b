"""Building a run's parts from its config: mesh, policy, sampler, scorer, rollout and
learner (its data and checkpoints are read and checked first: training/inputs.py). The
loop (training/loop.py) receives them ready to use; each part's own package decides its
details (rewards/build.py the reward, rollout/modes.py the rollout mode,
algorithms/registry.py the learner).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import jax

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import registry
from rlhf_jax.algorithms.learner import Learner
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import unfit
from rlhf_jax.data import Example
from rlhf_jax.data import config as data_config_lib
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.models.config import model_layout
from rlhf_jax.models.config import model_numerics
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.rollout.base import Rollout
from rlhf_jax.rollout import reference as reference_lib
from rlhf_jax.rollout.lookahead import LookAhead
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.sampling import protocol as sampler_protocol


@dataclasses.dataclass
class Policy:
  """The initial policy as loaded: model (trainer numerics), params on the mesh,
  tokenizer, prompt prefix, and how the run's prompts become its tokens (`prompts`)."""
  model: Any
  params: Any
  tokenizer: Any
  prefix: list[int]
  prefix_tokens: list[str]
  prompts: PromptFormat | None = None


def prompt_format(c, tokenizer, prefix) -> PromptFormat:
  """The run's prompt rendering (`data.chat_template`, `data.system_prompt`,
  `data.prompt_length`) for a policy's tokenizer and prefix; the tokenizer's template
  renders (prompts and multi-turn tool turns alike) get `data.template_timeout_s`."""
  if hasattr(tokenizer, "template_timeout_s"):  # a models.Tokenizer (not a test's fake)
    tokenizer.template_timeout_s = c.data.template_timeout_s
  return PromptFormat(tokenizer, tuple(prefix), chat_template=c.data.chat_template,
                      system_prompt=c.data.system_prompt,
                      prompt_length=c.data.prompt_length,
                      template_kwargs=data_config_lib.template_kwargs(c.data))


def trainer_mesh(c) -> jax.sharding.Mesh:
  """The (data, fsdp, expert, tensor) mesh of `config.mesh` over the first devices it
  needs (−1 takes the rest); the default 1×1×1×1 is one device. A job of several processes
  is checked first (`check_job`)."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "expert": c.mesh.expert,
           "tensor": c.mesh.tensor}
  if -1 in sizes.values():
    sizes = parallel.resolve_axis_sizes(sizes, jax.device_count())
  check_job(c, sizes)
  count = math.prod(sizes.values())
  return parallel.make_mesh(**sizes, devices=jax.devices()[:count])


def check_expert_axis(shards: int, num_experts: int) -> None:
  """`mesh.expert` (`shards`; -1 is checked once resolved) against the policy's
  `num_experts` (ConfigError naming the field): it splits the experts of a mixture of
  experts, so it divides num_experts; a dense model (0) has none to split and needs 1
  (`mesh.data` splits the rows the same way)."""
  if shards in (1, -1):
    return
  if not num_experts:
    invalid("mesh.expert", shards, "must be 1 for a dense model (expert parallelism splits "
            "a mixture of experts' experts; use mesh.data to split the rows)")
  if num_experts % shards:
    invalid("mesh.expert", shards, f"must divide the model's {num_experts} experts "
            "(num_experts)")


def check_job(c, sizes: dict[str, int]) -> None:
  """What a job of several processes needs (ConfigError naming the field otherwise): a mesh
  over every device, tensor groups within a process, the in-process sampler, no partial
  rollouts, and with `rollout.max_staleness` > 0 rule rewards (a reward model's program on
  the worker thread would order its collectives against the learner's per process)."""
  processes = jax.process_count()
  if processes == 1:
    return
  count = math.prod(sizes.values())
  if count != jax.device_count():
    invalid("mesh", sizes, f"a job of {processes} processes needs a mesh over all "
            f"{jax.device_count()} devices (set one axis to -1)")
  if jax.local_device_count() % sizes["tensor"]:
    invalid("mesh.tensor", sizes["tensor"], f"must divide the {jax.local_device_count()} "
            "devices of each process")
  if remote_sampler(c):
    field = "sampler.address" if c.sampler.address else "sampler.addresses"
    invalid(field, c.sampler.address or tuple(c.sampler.addresses), "must be empty in a job "
            f"of {processes} processes (each samples its share on its own devices)")
  if not LookAhead.of(c).synchronous and reward_build.uses_models(c):
    invalid("rollout.max_staleness", c.rollout.max_staleness, "must be 0 with a reward "
            f"model in a job of {processes} processes")
  if LookAhead.of(c).partial:  # process_shards: new weights land between generations only
    invalid("rollout.partial_rollouts", True, f"must be False in a job of {processes} processes")


def check_deterministic(c) -> None:
  """`train.deterministic` on a GPU needs XLA's flag set before JAX started."""
  flags = os.environ.get("XLA_FLAGS", "")
  if (c.train.deterministic and jax.default_backend() == "gpu"
      and "--xla_gpu_deterministic_ops=true" not in flags):
    invalid("train.deterministic", True, "needs XLA_FLAGS=--xla_gpu_deterministic_ops=true "
            "before JAX starts (launch/train.py sets it; in your own program, export it first)")


def policy_checkpoint_dir(c, workdir: str) -> str:
  """Where a run's initial policy lives: `model.checkpoint`, or <workdir>/sft."""
  return c.model.checkpoint or os.path.join(workdir, "sft")


def offline_path(c, workdir: str) -> str:
  """`data.offline_file`, or <workdir>/offline.jsonl (a built-in task's run's labelled one)."""
  return c.data.offline_file or os.path.join(workdir, "offline.jsonl")


def load_policy(c, workdir: str, mesh) -> Policy:
  """The initial policy from `model.checkpoint` (or the warm start in <workdir>/sft),
  computing in `model.dtype` at `model.matmul_precision`, params in the training layout."""
  directory = policy_checkpoint_dir(c, workdir)
  if not os.path.exists(os.path.join(directory, "config.json")):
    unfit("model.checkpoint", f"no policy checkpoint in {directory!r} (run launch/sft.py, "
          "or for a built-in task's run launch/train.py, which trains the warm start first)")
  check_expert_axis(mesh.shape["expert"], models.read_hf_config(directory).num_experts)
  model, params = models.load_hf_checkpoint(directory, **model_layout(c.model))
  model = models.with_numerics(model, **model_numerics(c.model))
  params = parallel.shard_params(params, parallel.param_shardings(
      params, model.logical_axes(), mesh))
  tokenizer = models.Tokenizer.from_directory(directory)
  prefix = models.load_prompt_prefix(directory, tokenizer)
  return Policy(model=model, params=params, tokenizer=tokenizer, prefix=prefix,
                prefix_tokens=[tokenizer.backend.id_to_token(i) for i in prefix],
                prompts=prompt_format(c, tokenizer, prefix))


def sampler_layout(c, model, params, mesh) -> Callable[[Any], Any]:
  """How the policy's parameters (trees like `params`) reach the sampler, decided once
  for a run: resharded to the sampler's layout (GENERATE_RULES: replicated over data and
  fsdp, split over tensor), or as they are when a server or the process-sharded sampler
  takes host arrays anyway."""
  if remote_sampler(c) or jax.process_count() > 1:  # the sampler takes it from here
    return lambda tree: tree
  shardings = parallel.param_shardings(params, model.logical_axes(), mesh,
                                       parallel.GENERATE_RULES)
  return lambda tree: parallel.reshard(tree, shardings)


def generation_params(c, policy: Policy, params, mesh):
  """`params` in the sampler's layout (`sampler_layout`)."""
  return sampler_layout(c, policy.model, params, mesh)(params)


def build_sampler(c, policy: Policy, mesh):
  """The in-process scheduler (sampler section), or a client of `sampler.address` (a
  fleet of `sampler.addresses`) that is sent the initial weights before the first rollout.
  In a job of several processes each process samples its share of the prompts on its own
  devices (`ProcessShardedSampler`); with `rollout.max_staleness` > 0 the sampler keeps
  the last weight versions (`LookAhead.sampler`: a `VersionedSampler`), or, with
  `rollout.partial_rollouts`, hands each new version to the samples in flight."""
  sampler = _sampler(c, policy, mesh)
  plan = LookAhead.of(c)
  if plan.synchronous:
    return sampler
  # Generation behind the learner samples with the version its job was given.
  return plan.sampler(sampler, generation_params(c, policy, policy.params, mesh))


def remote_sampler(c) -> bool:
  """Whether generation happens on sampling servers (`sampler.address` or `.addresses`)."""
  return bool(c.sampler.address or tuple(c.sampler.addresses))


def require_in_process_sampler(c, method: str) -> None:
  """ConfigError naming the sampler field that is set (`sampler.address` or
  `.addresses`) when `method` steps and cancels samples in the in-process scheduler itself
  (best-of-n, Q♯)."""
  for field, value in (("address", c.sampler.address),
                       ("addresses", tuple(c.sampler.addresses))):
    if value:
      invalid(f"sampler.{field}", value, f"must be empty: {method} runs the in-process "
              "scheduler")


def _sampler(c, policy: Policy, mesh):
  if jax.process_count() > 1 and not remote_sampler(c):
    return process_sharded_sampler(c, policy, mesh)
  if remote_sampler(c):
    # grpc is the `serve` extra's: imported only when a sampler server is configured.
    from rlhf_jax.sampling.remote import connect as remote  # pylint: disable=import-outside-toplevel
    sampler = remote.connect(c.sampler)  # a client, or a fleet of sampler.addresses
    remote.push_initial(sampler, policy.params)
    if reference_lib.from_sampler(c):  # the frozen reference: a teacher, or the policy
      reference_lib.send_reference(sampler, distillation.sampler_reference_params(
          c, policy.model, policy.params, mesh), c.model.dtype)
    return sampler
  return sampler_config_lib.build_scheduler(
      c.sampler, policy.model, generation_params(c, policy, policy.params, mesh),
      tokenizer=policy.tokenizer, seed=c.seed,
      requests=rollout_config_lib.sampling_params(c.rollout, ()),
      record_routes=records_routes(c, policy.model.config))


def records_routes(c, model_config) -> bool:
  """Whether the run's in-process sampler records each token's experts (a mixture-of-
  experts policy): for routing replay R3 (`algorithm.moe.routing_replay`), or to measure
  the route flip rate (`algorithm.moe.measure_route_flips`)."""
  m = c.algorithm.moe
  return bool(model_config.num_experts) and (m.routing_replay == "R3"
                                              or m.measure_route_flips)


def process_sharded_sampler(c, policy: Policy, mesh):
  """This process's scheduler on its local devices (the policy replicated over them, split
  over `mesh.tensor` as GENERATE_RULES say), behind a `ProcessShardedSampler`."""
  from rlhf_jax.sampling.process_shards import ProcessShardedSampler  # pylint: disable=import-outside-toplevel
  local_mesh = parallel.make_mesh(data=-1, tensor=c.mesh.tensor,
                                  devices=parallel.local_devices(mesh.devices.flat))

  def to_local(params):
    return parallel.reshard(params, parallel.param_shardings(
        params, policy.model.logical_axes(), local_mesh, parallel.GENERATE_RULES))

  params = to_local(parallel.fully_replicated_host_value(policy.params, mesh))
  local = sampler_config_lib.build_scheduler(c.sampler, policy.model, params,
                                             tokenizer=policy.tokenizer, seed=c.seed,
                                             record_routes=records_routes(
                                                 c, policy.model.config))
  return ProcessShardedSampler(local, mesh, to_local)


def rollout_parts(c, policy: Policy, sampler, scorer: Scorer, examples: list[Example] = (),
                  *, workdir: str = "", log: Callable[[str], None] = print
                  ) -> rollout_modes.RolloutParts:
  """The pieces the rollout mode builds its rollout and evaluator from (rollout/modes.py):
  the policy, sampler, scorer and training `examples`, the PRM's step ends, whether the
  learner reads pairs, and the offline data's path. `close()` it when no rollout owns
  its environment workers (an evaluation alone)."""
  return rollout_modes.RolloutParts(
      policy, sampler, scorer, examples,
      step_end_ids=reward_build.step_end_ids(c, policy.tokenizer),
      pairs=registry.learner_spec(c).pairs, offline_path=offline_path(c, workdir), log=log)


def build_rollout(c, parts: rollout_modes.RolloutParts) -> Rollout:
  """The rollout of the run's mode (`rollout_mode(c).build`) over `parts`; a mode that
  samples gets the sampler-side reference around it, run inline (k = 0) or k steps ahead
  as `LookAhead.rollout` decides, once."""
  mode = rollout_modes.rollout_mode(c)
  inner = mode.build(c, parts)
  if mode.fixed_data:  # nothing sampled: no reference from the sampler, nothing ahead
    return inner
  sampler = parts.sampler
  if reference_lib.from_sampler(c):
    inner = reference_lib.SamplerReferenceRollout(
        inner, sampler_protocol.require_extra(sampler, sampler_protocol.ReferenceSampler,
                                              "rollout.reference_logprobs='sampler'"))
  return LookAhead.of(c).rollout(inner, sampler, parts.scorer)


def build_learner(c, policy: Policy, mesh) -> Learner:
  """The learner of `algorithm.learner` (algorithms/registry.py) for the policy."""
  return registry.build_learner(c, policy.model, policy.params, mesh)


def build_evaluator(c, parts: rollout_modes.RolloutParts, held_out: list[Example],
                    scorer: Scorer) -> Callable[..., dict[str, float]]:
  """The held-out evaluation of the run's mode, `evaluate(samples=, temperature=, seed=) ->
  figures` (`rollout_mode(c).evaluator`: one response per sample, or whole episodes with
  the run's environment on the workers of `parts`)."""
  return rollout_modes.rollout_mode(c).evaluator(c, parts, held_out, scorer)
