"""One error type for bad configuration, shared by every module that owns a config section.

A `ConfigError` is one line that starts with the field's full path and says which of
two things went wrong:

  config.rollout.temprature: unknown field; did you mean 'temperature'?
  config.rollout.temperature: invalid value -1.0: must be >= 0

Validators raise the second with `invalid(field, value, requirement)` (or the range
and choice helpers below), whose requirement states the allowed values or range;
`rlhf_jax/cli.py` raises the first, with `unknown_field`, for a command-line override
whose path is not in the config tree. Launchers print either as `error: <message>`
and exit with status 2.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
import types
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
  """Raises `config.<field>: invalid value: <reason>`, for a value that is valid on its own
  but does not fit what it meets later (the data's tasks, a tokenizer): `reason` names
  what it does not fit."""
  raise ConfigError(f"config.{field}: {INVALID_VALUE}: {reason}", field=field,
                    kind=INVALID_VALUE)


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


def load_object(path: str, field: str, *, accept: Callable[[Any], bool] = callable,
                what: str = "callable", error: Callable[[str], Exception] | None = None
                ) -> Any:
  """The attribute named by "package.module:name" or "path/to/file.py:name" of a config
  field (`env.factory`, `algorithm.advantage.estimator`, `algorithm.policy_loss.kind`,
  `rollout.mode`, `reward.function`, ...), imported before any work: the one loader of
  every `module:name`. A dotted module is imported from the working directory too (as
  TRL and verl users run their scripts: `import_user_module`).

  Raises:
    ConfigError: naming `field`, for a malformed path, a module that does not import (with
      the directories searched when it is not found), or a missing attribute or one that
      `accept` refuses (`what` names what it must be). With `error`, `error(<reason>)`
      instead (e.g. the reward functions' RewardFunctionError, whose caller names the field).
  """
  def refuse(reason: str) -> NoReturn:
    if error is not None:
      raise error(reason)
    invalid(field, path, reason)

  module_name, colon, attribute = path.rpartition(":")
  if not colon or not module_name or not attribute:
    refuse(f"must be 'package.module:{what}' or 'path/to/file.py:{what}'")
  try:
    module = import_user_module(module_name)
  except Exception as failure:  # pylint: disable=broad-except  # user code: anything
    refuse(f"its module does not import: {type(failure).__name__}: {failure}")
  value = getattr(module, attribute, None)
  if value is None or not accept(value):
    refuse(f"module {module_name!r} has no {what} {attribute!r}"
           + ("" if value is None else f" (it is a {type(value).__name__})"))
  return value


def import_user_module(module: str) -> types.ModuleType:
  """The module of a `module:name` spec: a file ("dir/file.py", loaded from its path under
  a name of its own, once per process), or a dotted name imported as Python does and, when
  its top package is not found there, from the working directory as well (appended to
  sys.path, as `python script.py` would find it beside the script).

  Raises:
    ModuleNotFoundError: the module is not found; the message says where it looked (the
      file, or the directories searched, shortened).
    Exception: whatever the module's own code raises on import.
  """
  if module.endswith(".py"):
    path = os.path.abspath(module)
    if not os.path.isfile(path):
      raise ModuleNotFoundError(f"no file {module!r}"
                                + ("" if path == module else f" (looked for {path})"))
    name = "rlhf_jax_user_" + hashlib.sha1(path.encode()).hexdigest()[:16]
    if name not in sys.modules:
      spec = importlib.util.spec_from_file_location(name, path)
      loaded = importlib.util.module_from_spec(spec)
      sys.modules[name] = loaded
      try:
        spec.loader.exec_module(loaded)
      except BaseException:
        del sys.modules[name]  # a later load runs the file again, not half a module
        raise
    return sys.modules[name]
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as missing:
    if not _names_part_of(missing.name, module):
      raise  # a module the user's module imports is missing: its own message says which
    cwd = os.getcwd()
    if missing.name == module.split(".")[0] and cwd not in sys.path:
      sys.path.append(cwd)
      try:
        return importlib.import_module(module)
      except ModuleNotFoundError as again:
        if not _names_part_of(again.name, module):
          raise
        missing = again
    raise ModuleNotFoundError(f"no module named {missing.name!r} (searched "
                              f"{_searched(missing.name)})", name=missing.name) from None


def _names_part_of(name: str | None, module: str) -> bool:
  """Whether `name` is `module` or one of its parent packages."""
  return bool(name) and (module == name or module.startswith(name + "."))


def _searched(name: str) -> str:
  """Where Python looked for module `name`: its parent package's directories, or the
  working directory and the other sys.path entries ('' is the working directory), each
  shortened, at most 6 shown."""
  parent = name.rpartition(".")[0]
  package = sys.modules.get(parent) if parent else None
  if package is not None:
    return f"package {parent!r}: " + _listed(list(getattr(package, "__path__", ())))
  cwd = os.getcwd()
  others = [entry for entry in sys.path if entry and os.path.abspath(entry) != cwd]
  return f"the working directory {cwd} and sys.path: " + _listed(others)


def _listed(directories: list[str], most: int = 6) -> str:
  shown = ", ".join(_short(d) for d in directories[:most]) or "nothing"
  return shown + (f" and {len(directories) - most} more" if len(directories) > most else "")


def _short(path: str) -> str:
  """`path` relative to the working directory when inside it, else with ~ for $HOME."""
  cwd = os.getcwd()
  if path.startswith(cwd + os.sep):
    return os.path.relpath(path, cwd)
  home = os.path.expanduser("~")
  if home not in ("", "/") and path.startswith(home + os.sep):
    return "~" + path[len(home):]
  return path


def at_least(section, prefix: str, fields: Iterable[str], low: int = 1) -> None:
  """`check_range(low=low)` for each of `fields` of the config `section` at `prefix`."""
  for name in fields:
    check_range(f"{prefix}.{name}", section[name], low=low)
