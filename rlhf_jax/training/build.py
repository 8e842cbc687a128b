"""Building a run's parts from its config: mesh, policy, data, sampler, scorer, rollout and
learner. The loop (training/loop.py) receives them ready to use; each part's own
package decides its details (rewards/build.py the reward, rollout/modes.py the
rollout mode, algorithms/registry.py the learner).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
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
from rlhf_jax.data.prompts import PromptError
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.data.prompts import check_prompts
from rlhf_jax.data.prompts import raw_prompts_note
from rlhf_jax.data.sources import located_examples
from rlhf_jax.models.config import model_layout
from rlhf_jax.models.config import model_numerics
from rlhf_jax.models.hf.checks import check_checkpoint_dir
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rewards import config as reward_config_lib
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.rollout.base import Rollout
from rlhf_jax.rollout import reference as reference_lib
from rlhf_jax.rollout.lookahead import LookAhead
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.sampling import protocol as sampler_protocol
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import registry as task_registry
from rlhf_jax.training import run_control


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
  """The (data, fsdp, tensor) mesh of `config.mesh` over the first devices it needs
  (−1 takes the rest); the default 1×1×1 is one device. A job of several processes is
  checked first (`check_job`)."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "tensor": c.mesh.tensor}
  if -1 in sizes.values():
    sizes = parallel.resolve_axis_sizes(sizes, jax.device_count())
  check_job(c, sizes)
  count = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  return parallel.make_mesh(**sizes, devices=jax.devices()[:count])


def check_job(c, sizes: dict[str, int]) -> None:
  """What a job of several processes needs (ConfigError naming the field otherwise): a mesh
  over every device, tensor groups within a process, the in-process sampler, no partial
  rollouts, and with `rollout.max_staleness` > 0 rule rewards (a reward model's program on
  the worker thread would order its collectives against the learner's per process)."""
  processes = jax.process_count()
  if processes == 1:
    return
  count = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
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
  """Where a run's initial policy lives: `model.checkpoint`, or <workdir>/sft (arith)."""
  return c.model.checkpoint or os.path.join(workdir, "sft")


def offline_path(c, workdir: str) -> str:
  """`data.offline_file`, or <workdir>/offline.jsonl (the arith variant's generated one)."""
  return c.data.offline_file or os.path.join(workdir, "offline.jsonl")


def load_policy(c, workdir: str, mesh) -> Policy:
  """The initial policy from `model.checkpoint` (or the arith warm start in <workdir>/sft),
  computing in `model.dtype` at `model.matmul_precision`, params in the training layout."""
  directory = policy_checkpoint_dir(c, workdir)
  if not os.path.exists(os.path.join(directory, "config.json")):
    unfit("model.checkpoint", f"no policy checkpoint in {directory!r} (for the arith "
          "variant run launch/sft.py, or launch/train.py, which trains the warm start first)")
  model, params = models.load_hf_checkpoint(directory, **model_layout(c.model))
  model = models.with_numerics(model, **model_numerics(c.model))
  params = parallel.shard_params(params, parallel.param_shardings(
      params, model.logical_axes(), mesh))
  tokenizer = models.Tokenizer.from_directory(directory)
  prefix = models.load_prompt_prefix(directory, tokenizer)
  return Policy(model=model, params=params, tokenizer=tokenizer, prefix=prefix,
                prefix_tokens=[tokenizer.backend.id_to_token(i) for i in prefix],
                prompts=prompt_format(c, tokenizer, prefix))


# Console notes already given in this process (the data are read by the pre-work check,
# then by the trainer).
_NOTES_SAID: set[str] = set()


def load_examples(c, prompts: PromptFormat | None = None, *, scorer: Scorer | None = None
                  ) -> tuple[list[Example], list[Example]]:
  """Training and held-out examples (`data.train_file` / `eval_file` read with the
  section's row layout, or generated `data.task` problems), checked before any work:
  every row's task has a scorer (`check_tasks`: `scorer`'s when one is handed to the
  trainer in Python) and, with `prompts`, every prompt renders and fits
  `data.prompt_length`. Errors are ConfigErrors naming the field, file and row; plain
  prompts sent raw to a checkpoint with a chat template get one logged warning
  (`raw_prompts_note`), once per process."""
  levels, weights = tuple(c.data.levels), tuple(c.data.level_weights)
  generate = task_registry.get_task(c.data.task).generate
  located = {}
  for field in ("train_file", "eval_file"):
    if c.data[field]:
      located[field] = _read_located(c, field)
    elif c.variant == "arith":  # generated problems (other seeds for the held-out ones)
      seed, count = (1, c.data.num_train) if field == "train_file" else (2, c.data.num_eval)
      located[field] = [(f"generated {c.data.task} problem {i}", e) for i, e in
                        enumerate(generate(c.seed + seed, count, levels, weights))]
    else:  # an hf run on offline data needs no prompts
      located[field] = []
  for field, rows in located.items():
    check_tasks(c, field, rows, scorer=scorer)
    if prompts is not None and c.data[field]:  # generated problems fit by construction
      try:
        check_prompts(prompts, rows)
      except PromptError as error:
        unfit(f"data.{field}", str(error))
  read = [field for field in located if c.data[field]]
  note = prompts and raw_prompts_note(prompts, [e for f in read for _, e in located[f]],
                                      " and ".join(f"config.data.{f}={c.data[f]}" for f in read))
  if note and note not in _NOTES_SAID:  # untemplated text for a chat model: said once
    _NOTES_SAID.add(note)
    logging.warning("%s", note)
  return ([e for _, e in located["train_file"]], [e for _, e in located["eval_file"]])


def _read_located(c, field: str) -> list[tuple[str, Example]]:
  try:
    return located_examples(c.data[field], **data_config_lib.read_options(c.data))
  except (OSError, ValueError) as error:
    unfit(f"data.{field}", str(error))


def check_tasks(c, field: str, located: list[tuple[str, Example]], *,
                scorer: Scorer | None = None) -> None:
  """Every row's task has a scorer: `scorer`'s tasks (`Scorer.check_tasks`) when one is
  handed to the trainer in Python (as benchmarks/grpo_step.py does); else a registered
  task, or any task when `reward.function` or a model route scores the samples; else a
  ConfigError naming the row, the task and the ways out. No row needs a scorer when the
  environment's rewards alone are the episode's reward (env.verifier=False)."""
  if rollout_modes.rewarded_by_environment(c):
    return
  if scorer is not None:  # the config's reward section does not score this run
    for task, where in {e.task: w for w, e in reversed(located)}.items():  # first rows
      try:
        scorer.check_tasks([task])
      except ValueError as error:
        unfit(f"data.{field}", f"{where}: the scorer handed to the trainer refuses task "
              f"{task!r}: {error}")
    return
  math_tasks = set(task_registry.scored_by("math", {e.task for _, e in located}))
  for where, example in located:  # the rule scorers' dependencies (a monitor's too)
    if example.task in math_tasks and importlib.util.find_spec("math_verify") is None:
      unfit(f"data.{field}", f"{where}: task {example.task!r} is scored by math-verify, "
            "which is not installed: pip install 'rlhf-jax[math]'")
  if reward_build.scores_any_task(c):
    return
  for where, example in located:
    if not task_registry.is_known(example.task):
      unfit(
          f"data.{field}", f"{where}: no scorer for task {example.task!r} (known: "
          f"{', '.join(task_registry.known_tasks())}); score it with reward.function="
          "'module:fn', or give the rows a known task (data.default_task, or data.columns="
          "'task=<column>', e.g. task=ability for verl files)"
          + (", or reward episodes by the environment alone (env.verifier=False)"
             if rollout_modes.rollout_mode(c).needs_environment else ""))


def check_checkpoint_family(directory: str) -> None:
  """A ConfigError naming `model.checkpoint` when its config.json describes a model
  family (or an option of one) that cannot be loaded; reads only config.json."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    try:
      hf_config = json.load(f)
    except ValueError as error:
      unfit("model.checkpoint", f"{path} is not JSON ({error})")
  try:
    models.config_from_hf(hf_config)
  except (ValueError, KeyError) as error:
    unfit("model.checkpoint", f"{directory}: {error}")


def check_data(c, workdir: str, *, read_offline: bool = True,
               scorer: Scorer | None = None) -> None:
  """Everything a run reads, before any work (`--validate_only` stops here): the workdir
  (no file in its place); the policy checkpoint's files (`check_checkpoint_dir`)
  and the reward models'; every row of the data files (`load_examples`: JSON, schema, task,
  encodability, length) with the policy's tokenizer — for the arith variant before its
  warm start, the task's own, which the warm start saves; with rollout.mode 'offline' the
  labelled groups of `data.offline_file`, unless `read_offline` is False (a labelling run's
  output; `scorer`: as in `load_examples`). Nothing loads; ConfigErrors name field, file, row."""
  if workdir:
    run_control.check_workdir(workdir)
  directory = policy_checkpoint_dir(c, workdir)
  field = "config.model.checkpoint"
  # The arith warm start trains a missing one (a directory without config.json included).
  if os.path.exists(os.path.join(directory, "config.json")) or c.variant != "arith":
    check_checkpoint_dir(directory, field if c.model.checkpoint else f"{field} (<workdir>/sft)")
    check_checkpoint_family(directory)
    try:
      tokenizer = models.Tokenizer.from_directory(directory)
      prefix = models.load_prompt_prefix(directory, tokenizer)
    except (OSError, ValueError) as error:
      unfit("model.checkpoint", f"{directory}: the tokenizer does not load: {error}")
    distillation.check_teacher(c, directory)  # its tokenizer is the policy's
  else:
    tokenizer = task_registry.get_task(c.data.task).tokenizer()
    prefix = [tokenizer.backend.token_to_id(t) for t in arith.PROMPT_PREFIX]
  check_reward_checkpoints(c)
  prompts = prompt_format(c, tokenizer, prefix)
  load_examples(c, prompts, scorer=scorer)
  mode = rollout_modes.rollout_mode(c)
  if read_offline and mode.check_data is not None:
    mode.check_data(c, prompts, pairs=registry.learner_spec(c).pairs)


def check_reward_checkpoints(c) -> None:
  """The files of every reward, judge or PRM checkpoint the run loads (the `reward` section's
  routes, `reward.process.checkpoint`): `check_checkpoint_dir`, naming the field."""
  sections = {"rm": "rm", "pairwise": "pairwise"}
  used = {sections.get(route, "genrm") for route in reward_config_lib.routes_needed(c.reward)}
  if c.reward.process.checkpoint:
    used.add("process")
  served = bool(c.reward.judge_sampler.address)  # the judges' weights are on its server
  for section in sorted(used):
    check_checkpoint_dir(
        c.reward[section].checkpoint, f"config.reward.{section}.checkpoint",
        weights=not (served and section in ("genrm", "pairwise")))


def generation_params(c, policy: Policy, params, mesh):
  """The policy in the sampler's layout (GENERATE_RULES: replicated over data and fsdp,
  split over tensor); a server gets host arrays anyway."""
  if remote_sampler(c) or jax.process_count() > 1:  # the sampler takes it from here
    return params
  return parallel.reshard(params, parallel.param_shardings(
      params, policy.model.logical_axes(), mesh, parallel.GENERATE_RULES))


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


def _sampler(c, policy: Policy, mesh):
  if jax.process_count() > 1 and not remote_sampler(c):
    return process_sharded_sampler(c, policy, mesh)
  if remote_sampler(c):
    # grpc is the `serve` extra's: imported only when a sampler server is configured.
    from rlhf_jax.sampling import remote  # pylint: disable=import-outside-toplevel
    sampler = remote.connect(c.sampler)  # a client, or a fleet of sampler.addresses
    remote.push_initial(sampler, policy.params)
    if reference_lib.from_sampler(c):  # the frozen reference: a teacher, or the policy
      reference_lib.send_reference(sampler, distillation.sampler_reference_params(
          c, policy.model, policy.params, mesh), c.model.dtype)
    return sampler
  return sampler_config_lib.build_scheduler(
      c.sampler, policy.model, generation_params(c, policy, policy.params, mesh),
      tokenizer=policy.tokenizer, seed=c.seed,
      requests=rollout_config_lib.sampling_params(c.rollout, ()))


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
                                             tokenizer=policy.tokenizer, seed=c.seed)
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
  samples gets the sampler-side reference and the look-ahead around it."""
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
