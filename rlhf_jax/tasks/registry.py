"""The tasks a run can score, in one table: each task's scoring rule and, for the built-in
ones, its problem generator.

    Task(name, scoring, verifier=None, generate=None, description="", ...)
    register_task(task)             a task of one's own, from Python (again: replaced)
    get_task(name) -> Task          KeyError naming the known tasks
    known_tasks() -> tuple[str]

`scoring` says which scorer judges a task: 'verifier' (a module-level
`fn(response, answer) -> Judgement | bool | float` run in killable workers), 'math'
(rewards/math.py's equivalence, with `reward.math_extractor`) or 'sandbox' (the code
sandbox, rewards/code.py). rewards/router.py builds the scorers from this table;
training/ reads a built-in task's run from its record (the problems, the prompt prefix,
the levels, the model from scratch, the run rules, the warm start) and imports no task
module; `data.task` is checked against it. A task that is in no table is scored only by
`reward.function`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from rlhf_jax.config_errors import one_of
from rlhf_jax.data.config import check_levels
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Registry
from rlhf_jax.registry import Section
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import arith_rewards
from rlhf_jax.tasks import demonstrations
from rlhf_jax.tasks import pycalc
from rlhf_jax.tasks import toolcalc

SCORINGS = ("verifier", "math", "sandbox")


@dataclasses.dataclass(frozen=True)
class Task:
  """One task: how its responses are scored and, optionally, how problems are made.

  Attributes:
    name: the `task` value of the data rows it scores.
    scoring: 'verifier', 'math' or 'sandbox' (module docstring).
    verifier: for 'verifier', the rule `fn(response_text, answer)`; module-level, so it
      can be sent to a worker process.
    generate: `fn(seed, count, levels, weights) -> list[Example]`, the problems of the
      built-in runs' `data.task`; None: the task needs a data file.
    extract: for 'verifier', optionally `fn(response_text) -> str | None`, the final
      answer a response gives (module-level): the evaluation's majority vote (maj@k) and
      its no-answer count read it.
    tokenizer: `fn() -> Tokenizer`, the task's own tokenizer for a model from scratch.
    demonstrations: `fn(tokenizer, *, seed, batch_size, levels, weights, prompt_prefix,
      prompt_length, response_length, direct_fraction, slip_rate) -> make_batch(step)`,
      the warm start's SFT batches (training/stages.py).
    description: one line for error messages and docs.
    prompt_prefix: the special tokens before every prompt with the task's own tokenizer
      (the warm start saves them with the checkpoint).
    levels: the difficulty levels `generate` and `demonstrations` take (`data.levels`,
      `sft.levels` are checked among them).
    model_config: `fn(*, vocab_size, hidden_size, num_layers, num_heads, max_positions)
      -> DecoderConfig`, the model from scratch its warm start trains (`model.*` sizes).
    validate_run: `fn(c, mode)`, the run settings the task assumes (`mode`: the run's
      RolloutMode); raises ConfigError naming the field.
    check_warm_start: `fn(directory)`, raises ConfigError (naming model.checkpoint) when
      a warm start found there cannot do the task.
    reward_data: `fn(kind, seed, count) -> list`, generated reward-model data ('pairs',
      'judged', 'judged_with_references'): the reward-model fits' default data.
  """
  name: str
  scoring: str
  verifier: Callable | None = None
  generate: Callable | None = None
  tokenizer: Callable | None = None
  demonstrations: Callable | None = None
  description: str = ""
  extract: Callable | None = None
  prompt_prefix: tuple[str, ...] = ()
  levels: tuple[int, ...] = ()
  model_config: Callable | None = None
  validate_run: Callable | None = None
  check_warm_start: Callable | None = None
  reward_data: Callable | None = None

  @property
  def warm_start(self) -> bool:
    """Whether the task trains its own warm start from scratch (<workdir>/sft): it has
    a tokenizer, demonstrations and a model shape."""
    return None not in (self.tokenizer, self.demonstrations, self.model_config)

  def __post_init__(self):
    if self.scoring not in SCORINGS:
      raise ValueError(f"task {self.name!r}: scoring {self.scoring!r}; allowed: "
                       f"{', '.join(SCORINGS)}.")
    if (self.scoring == "verifier") != (self.verifier is not None):
      raise ValueError(f"task {self.name!r}: a verifier is given exactly when scoring is "
                       "'verifier'.")


def _check_picklable(task: Task, name: str, field: str) -> None:
  """ValueError unless the task's verifier and extract can reach a worker process (a
  module-level function, or a functools.partial of one)."""
  del field
  import pickle  # pylint: disable=import-outside-toplevel
  for role in ("verifier", "extract"):
    if getattr(task, role) is None:
      continue
    try:
      pickle.dumps(getattr(task, role))
    except Exception as error:  # lambdas and closures cannot reach a worker process
      raise ValueError(f"task {name!r}: the {role} must be a module-level function "
                       f"(or a functools.partial of one): {error}") from None


# The table of the tasks the rule scorers judge (a data row's `task`, `data.task`).
TASKS: Registry[Task] = Registry("task", "data.task", Task, what="Task",
                                 check=_check_picklable)


def register_task(task: Task) -> Task:
  """Adds `task` to the table (a task of one's own; call it before building the Trainer):
  `TASKS.register`. Registering a name again replaces it (a notebook cell run again); a
  built-in task cannot be replaced."""
  return TASKS.register(task.name, task)


def get_task(name: str) -> Task:
  """The registered task `name`; KeyError naming the known ones."""
  return TASKS[name]


def is_known(name: str) -> bool:
  """Whether `name` is a registered task (one the rule scorers can judge)."""
  return name in TASKS


def scored_by(scoring: str, tasks) -> list[str]:
  """The registered tasks among `tasks` whose scoring is `scoring` ('verifier', 'math',
  'sandbox'), sorted; unknown names are left out."""
  return sorted(t for t in set(tasks) if t in TASKS and TASKS[t].scoring == scoring)


def known_tasks() -> tuple[str, ...]:
  """The registered task names, sorted."""
  return tuple(sorted(TASKS))


def generated_tasks() -> tuple[str, ...]:
  """The tasks with a problem generator (the built-in runs' `data.task` choices)."""
  return tuple(sorted(name for name, t in TASKS.items() if t.generate is not None))


def builtin_run(name: str) -> Task | None:
  """The record of a run's `data.task` when the run is that built-in task's (its problems
  generated, its warm start trained from scratch); None for an empty `data.task`: the
  run's own data files and `model.checkpoint`."""
  return TASKS[name] if name else None


def task_levels(name: str) -> tuple[int, ...]:
  """The difficulty levels of task `name` (its record's), or the arith task's when it is
  not a registered task with levels (the `data.task` check names it first)."""
  task = TASKS[name] if name in TASKS else None
  return task.levels if task is not None and task.levels else TASKS[arith.TASK].levels


def check_task_fields(c, checking: Checking) -> None:
  """The fields that name a task of this table: `data.task` a generated task (empty: the
  run's own data), and `data.levels` / `sft.levels` among its levels (with their weights)."""
  del checking
  if c.data.task:
    one_of("data.task", c.data.task, generated_tasks())
  levels = task_levels(c.data.task)
  check_levels("data", c.data.levels, c.data.level_weights, allowed=levels)
  check_levels("sft", c.sft.levels, c.sft.level_weights, allowed=levels)


# A rule over the data and sft sections' fields, declared by the table that knows the tasks.
SECTION = Section("task", check=check_task_fields, after=("data", "sft"))


for _task in (
    Task(arith.TASK, "verifier", verifier=arith.verify, generate=arith.examples,
         tokenizer=arith.tokenizer, demonstrations=demonstrations.arith_sft_batches,
         description="worked arithmetic; the last 'Answer: N' line, as an integer",
         extract=arith.extract_answer, prompt_prefix=arith.PROMPT_PREFIX,
         levels=tuple(sorted(arith.LEVELS)), model_config=arith.model_config,
         reward_data=arith_rewards.reward_data),
    Task(toolcalc.TASK, "verifier", verifier=toolcalc.verify, generate=toolcalc.examples,
         tokenizer=toolcalc.tokenizer, demonstrations=toolcalc.sft_batches,
         description="products with a calculator tool (multi-turn)",
         extract=arith.extract_answer, prompt_prefix=arith.PROMPT_PREFIX,
         levels=tuple(sorted(toolcalc.LEVELS)), model_config=arith.model_config,
         validate_run=toolcalc.validate_run, check_warm_start=toolcalc.check_warm_start),
    Task(pycalc.TASK, "sandbox", generate=pycalc.examples, tokenizer=arith.tokenizer,
         demonstrations=demonstrations.pycalc_sft_batches,
         description="arithmetic as a Python program, run in the sandbox",
         prompt_prefix=arith.PROMPT_PREFIX, levels=tuple(sorted(arith.LEVELS)),
         model_config=arith.model_config),
    Task("math", "math", description="math-verify equivalence of the final answer"),
    Task("code", "sandbox", description="a Python program against unit tests, sandboxed"),
):
  TASKS.register(_task.name, _task, built_in=True)
