"""One error type for bad configuration, shared by every module that owns a config section.

A `ConfigError` is one line that starts with the field's full path and says which of
three things went wrong:

  config.rollout.temprature: unknown field; did you mean 'temperature'?
  config.rollout.temperature: invalid value -1.0: must be >= 0
  config.data.train_file: rows.jsonl:3: no scorer for task 'proof' (known: ...)

Validators raise the second with `invalid(field, value, requirement)` (or the range
and choice helpers below), whose requirement states the allowed values or range; the
third, with `unfit`, is a value valid on its own whose file, checkpoint, data or job
does not fit it, found when that is read. `rlhf_jax/cli.py` raises the first, with
`unknown_field`, for a command-line override whose path is not in the config tree.
Each carries its field. Launchers print any of them as `error: <message>` and exit
with status 2.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, NoReturn

UNKNOWN_FIELD = "unknown field"
INVALID_VALUE = "invalid value"
_MAX_SHOWN = 80  # characters of a value's repr in a message (templates can be long)


class ConfigError(ValueError):
  """An impossible or unknown config field; the message starts with its full path.

  Attributes:
    field: the dotted path below `config` (None for errors raised with a bare message).
    kind: UNKNOWN_FIELD, INVALID_VALUE, or None for a bare message.
  """

  def __init__(self, message: str, *, field: str | None = None, kind: str | None = None):
    super().__init__(" ".join(str(message).split("\n")))  # always one line
    self.field = field
    self.kind = kind


def show(value: Any) -> str:
  """`repr(value)`, shortened to one readable line."""
  text = repr(value)
  return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."


def invalid(field: str, value: Any, requirement: str) -> NoReturn:
  """Raises `config.<field>: invalid value <value>: <requirement>`; the requirement
  names the allowed values or range (and the other fields it depends on)."""
  raise ConfigError(f"config.{field}: {INVALID_VALUE} {show(value)}: {requirement}",
                    field=field, kind=INVALID_VALUE)


def unfit(field: str, reason: str) -> NoReturn:
  """Raises `config.<field>: <reason>`, for a value that is valid on its own but does not
  fit what it meets later (its file's rows, a checkpoint, the data's tasks, a job of
  several processes): `reason` names that, e.g. "rows.jsonl:3: no scorer for task 'x'"."""
  raise ConfigError(f"config.{field}: {reason}", field=field, kind=INVALID_VALUE)


def unknown_field(field: str, known: Iterable[str], hint: str = "") -> NoReturn:
  """Raises `config.<field>: unknown field; did you mean ...?` (difflib's close matches
  among the section's `known` fields), or the section's fields when none is close, or
  `hint` when given."""
  if not hint:
    section, _, name = field.rpartition(".")
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = ("did you mean " + " or ".join(repr(match) for match in close) + "?" if close else
            f"config{'.' + section if section else ''} has {', '.join(known) or 'no fields'}")
  raise ConfigError(f"config.{field}: {UNKNOWN_FIELD}; {hint}", field=field,
                    kind=UNKNOWN_FIELD)


# The peers' names for our fields (TRL's GRPOConfig, verl's ppo_trainer.yaml, OpenRLHF's
# flags), as a user coming from one of them types them: name (or dotted tail) → (our
# field, whose name it is, a note when the meaning differs). `peer_hint` reads it;
# tests/launch/test_no_dead_ends.py checks every field is one of the grpo preset's.
PEER_NAMES: dict[str, tuple[str, str, str]] = {
    # TRL
    "num_generations": ("rollout.group_size", "TRL's", ""),
    "beta": ("algorithm.kl.coef", "TRL's", ""),
    "epsilon": ("algorithm.policy_loss.clip_low", "TRL's", ""),
    "epsilon_high": ("algorithm.policy_loss.clip_high", "TRL's", ""),
    "max_completion_length": ("rollout.max_new_tokens", "TRL's", ""),
    "max_prompt_length": ("data.prompt_length", "TRL's and verl's", ""),
    "per_device_train_batch_size": (
        "rollout.prompts_per_step", "TRL's",
        "TRL's counts completions per device: ours counts prompts, each sampled "
        "rollout.group_size times"),
    "learning_rate": ("optimizer.learning_rate", "TRL's", ""),
    "max_steps": ("train.steps", "TRL's", ""),
    "num_train_epochs": ("train.steps", "TRL's", "ours counts steps"),
    # verl
    "train_batch_size": ("rollout.prompts_per_step", "verl's", ""),
    "rollout.n": ("rollout.group_size", "verl's", ""),
    "kl_coef": ("algorithm.kl.coef", "verl's", ""),
    "kl_loss_coef": ("algorithm.kl.coef", "verl's", ""),
    "clip_ratio": ("algorithm.policy_loss.clip_low", "verl's", "clip_high is the upper one"),
    "clip_ratio_low": ("algorithm.policy_loss.clip_low", "verl's", ""),
    "clip_ratio_high": ("algorithm.policy_loss.clip_high", "verl's", ""),
    "ppo_mini_batch_size": ("train.minibatches", "verl's",
                            "ours is a count: rollout.prompts_per_step / ppo_mini_batch_size"),
    "ppo_micro_batch_size_per_gpu": ("train.micro_batches", "verl's",
                                     "ours is a count of micro-batches per minibatch"),
    "max_response_length": ("rollout.max_new_tokens", "verl's", ""),
    "total_training_steps": ("train.steps", "verl's", ""),
    "entropy_coeff": ("algorithm.policy_loss.entropy_coef", "verl's", ""),
    "lr": ("optimizer.learning_rate", "verl's", ""),
    # OpenRLHF
    "n_samples_per_prompt": ("rollout.group_size", "OpenRLHF's", ""),
    "init_kl_coef": ("algorithm.kl.coef", "OpenRLHF's", ""),
    "micro_train_batch_size": ("train.micro_batches", "OpenRLHF's",
                               "ours is a count of micro-batches per minibatch"),
    "rollout_batch_size": ("rollout.prompts_per_step", "OpenRLHF's", ""),
    "generate_max_len": ("rollout.max_new_tokens", "OpenRLHF's", ""),
    "prompt_max_len": ("data.prompt_length", "OpenRLHF's", ""),
    "actor_learning_rate": ("optimizer.learning_rate", "OpenRLHF's", ""),
    "eps_clip": ("algorithm.policy_loss.clip_low", "OpenRLHF's", ""),
}


def peer_hint(path: str, has_field: Callable[[str], bool] = lambda field: True
              ) -> str | None:
  """"did you mean 'config.<ours>' (TRL's <name>)?" when the longest dotted tail of the
  unknown `path` is a peer's name in PEER_NAMES whose field of ours `has_field`; else None."""
  parts = path.split(".")
  for start in range(len(parts)):
    entry = PEER_NAMES.get(".".join(parts[start:]))
    if entry is not None and has_field(entry[0]):
      ours, whose, note = entry
      return (f"did you mean 'config.{ours}' ({whose} {'.'.join(parts[start:])}"
              f"{'; ' + note if note else ''})?")
  return None


def one_of(field: str, value: Any, allowed: Iterable[Any]) -> None:
  """ConfigError unless `value` is one of `allowed`."""
  allowed = tuple(allowed)
  if value not in allowed:
    invalid(field, value, f"must be one of {', '.join(str(a) for a in allowed)}")


def check_range(field: str, value: Any, *, low: float | None = None,
                high: float | None = None, low_open: bool = False, high_open: bool = False,
                note: str = "") -> None:
  """ConfigError unless `low <= value <= high` (`<` on an open end; None: unbounded).
  NaN fails every bound. `note` follows the range, e.g. "(0: off)"."""
  below = low is not None and not (value > low if low_open else value >= low)
  above = high is not None and not (value < high if high_open else value <= high)
  if not (below or above):
    return
  if low is not None and high is not None:
    bounds = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
  elif low is not None:
    bounds = f"{'>' if low_open else '>='} {low}"
  else:
    bounds = f"{'<' if high_open else '<='} {high}"
  invalid(field, value, f"must be {bounds}{' ' + note if note else ''}")


def at_least(section, prefix: str, fields: Iterable[str], low: int = 1) -> None:
  """`check_range(low=low)` for each of `fields` of the config `section` at `prefix`."""
  for name in fields:
    check_range(f"{prefix}.{name}", section[name], low=low)
