"""The run's inputs, read and checked before any work: the data files (every row: its
JSON, its prompt against the template and the length budget, a task some scorer scores),
the policy's and the reward models' checkpoint directories, the data a warm start or an
offline mode reads. A bad row, file or directory is one line naming it (ConfigError
naming the field); `load_examples` then gives the rows as Examples.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os

from rlhf_jax import models
from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import registry
from rlhf_jax.config_errors import unfit
from rlhf_jax.data import Example
from rlhf_jax.data import config as data_config_lib
from rlhf_jax.data.prompts import PromptError
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.data.prompts import check_prompts
from rlhf_jax.data.prompts import raw_prompts_note
from rlhf_jax.data.sources import located_examples
from rlhf_jax.models.hf.checks import check_checkpoint_dir
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rewards import config as reward_config_lib
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.tasks import registry as task_registry
from rlhf_jax.training import run_control
from rlhf_jax.training.build import check_expert_axis
from rlhf_jax.training.build import policy_checkpoint_dir
from rlhf_jax.training.build import prompt_format


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
  builtin = task_registry.builtin_run(c.data.task)
  located = {}
  for field in ("train_file", "eval_file"):
    if c.data[field]:
      located[field] = _read_located(c, field)
    elif builtin is not None:  # generated problems (other seeds for the held-out ones)
      seed, count = (1, c.data.num_train) if field == "train_file" else (2, c.data.num_eval)
      located[field] = [(f"generated {c.data.task} problem {i}", e) for i, e in
                        enumerate(builtin.generate(c.seed + seed, count, levels, weights))]
    else:  # a run on one's own offline data needs no prompts
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
  (no file in its place); the policy checkpoint's files (`check_checkpoint_dir`), its
  experts against `mesh.expert`, and the reward models'; every row of the data files
  (`load_examples`: JSON, schema, task, encodability, length) with the policy's tokenizer —
  for a built-in task's run (`data.task`) before its warm start, the task's own, which the
  warm start saves; with rollout.mode 'offline' the labelled groups of
  `data.offline_file`, unless `read_offline` is False (a labelling run's output; `scorer`:
  as in `load_examples`). Nothing loads; ConfigErrors name field, file, row."""
  if workdir:
    run_control.check_workdir(workdir)
  directory = policy_checkpoint_dir(c, workdir)
  field = "config.model.checkpoint"
  # A built-in task's warm start trains a missing one (a directory without config.json too).
  builtin = task_registry.builtin_run(c.data.task)
  if os.path.exists(os.path.join(directory, "config.json")) or builtin is None:
    check_checkpoint_dir(directory, field if c.model.checkpoint else f"{field} (<workdir>/sft)")
    check_checkpoint_family(directory)
    check_expert_axis(c.mesh.expert, models.read_hf_config(directory).num_experts)
    try:
      tokenizer = models.Tokenizer.from_directory(directory)
      prefix = models.load_prompt_prefix(directory, tokenizer)
    except (OSError, ValueError) as error:
      unfit("model.checkpoint", f"{directory}: the tokenizer does not load: {error}")
    distillation.check_teacher(c, directory)  # its tokenizer is the policy's
  else:  # the warm start is a dense model from scratch
    check_expert_axis(c.mesh.expert, 0)
    tokenizer = builtin.tokenizer()
    prefix = [tokenizer.backend.token_to_id(t) for t in builtin.prompt_prefix]
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
