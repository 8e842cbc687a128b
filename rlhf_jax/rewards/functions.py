"""Reward functions of one's own: `reward.function = "package.module:fn"` (several as
"a:f,b:g", weighted by `reward.function_weights`), in the signatures other libraries use.

Two conventions, told apart by the function's parameter names:

  TRL (also tunix, MaxText)   fn(prompts, completions, **columns) -> list[float | None]
      called once per chunk of samples with keyword lists: `prompts` (the prompt text as
      the model saw it, chat template applied), `completions` (the decoded responses),
      `completion_ids` (their tokens), and every column of the rows under its own name:
      ours (`answer`, `task`) and the file's own (`solution`, `data_source`, ...).
  verl                        compute_score(data_source, solution_str, ground_truth,
                                            extra_info=None) -> float | dict
      called once per sample; a dict's "score" is the reward, its other numbers are logged.

`async def` functions are awaited. A function runs in killable worker processes
(sandbox/workers.py), each call within `reward.timeout_s`: an exception, a hang, a wrong
type or a wrong length fails those samples with a one-line reason (`reward_failures`),
never the run. `None` means "not scored by this function"; a sample that no function
scores is a failure. The reward is Σ weight × value over the functions that scored it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
from typing import Any, Callable, Sequence

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import load_object

VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")
SAMPLES_PER_CALL = 16  # a TRL-style call's chunk: a hang costs at most this many samples


class RewardFunctionError(ValueError):
  """A `reward.function` entry that cannot be loaded or fits neither convention."""


class RewardWeightsError(RewardFunctionError):
  """`reward.function_weights` that do not fit the functions."""


@dataclasses.dataclass(frozen=True)
class RewardFunction:
  """One configured function.

  Attributes:
    spec: "package.module:callable" or "path/to/file.py:callable".
    name: its metric name (the callable's name; a repeated one gets "_2", "_3").
    convention: 'trl' or 'verl' (module docstring).
    weight: its weight in the sum.
  """
  spec: str
  name: str
  convention: str
  weight: float = 1.0


@functools.lru_cache(maxsize=None)
def load_callable(spec: str) -> Callable:
  """The callable of "module:name" (or "file.py:name"), by the one loader of every
  `module:name` (config_errors.load_object: the working directory on the path, where it
  looked when not found); RewardFunctionError naming what is wrong: no colon, a module
  that does not import, a missing or non-callable name."""
  return load_object(spec, "reward.function", what="function", error=RewardFunctionError)


def convention_of(fn: Callable, spec: str) -> str:
  """'verl' when the parameters name verl's (data_source, solution_str, ground_truth),
  'trl' when it takes `completions` (or **kwargs); else RewardFunctionError."""
  try:
    parameters = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    raise RewardFunctionError(f"{spec!r}: its signature cannot be read") from None
  names = set(parameters)
  if set(VERL_PARAMETERS) <= names:
    return "verl"
  keywords = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
  if "completions" in names or keywords:
    return "trl"
  raise RewardFunctionError(
      f"{spec!r} takes ({', '.join(parameters)}): neither TRL's fn(prompts, completions, "
      "**columns) nor verl's compute_score(data_source, solution_str, ground_truth, "
      "extra_info=None)")


def parse_functions(specs: str, weights: str = "") -> list[RewardFunction]:
  """`reward.function` and `reward.function_weights` as RewardFunctions, each loaded and
  its convention found (RewardFunctionError naming the entry otherwise)."""
  entries = [s.strip() for s in specs.split(",") if s.strip()]
  values = [w.strip() for w in weights.split(",") if w.strip()] if weights else []
  if values and len(values) != len(entries):
    raise RewardWeightsError(f"{len(values)} weights for {len(entries)} functions")
  try:
    numbers = [float(w) for w in values] or [1.0] * len(entries)
  except ValueError:
    raise RewardWeightsError(f"weights {weights!r} must be numbers") from None
  if any(not math.isfinite(w) for w in numbers):
    raise RewardWeightsError(f"weights {weights!r} must be finite")
  out, seen = [], {}
  for spec, weight in zip(entries, numbers):
    fn = load_callable(spec)
    base = getattr(fn, "__name__", spec.rpartition(":")[2])
    seen[base] = seen.get(base, 0) + 1
    name = base if seen[base] == 1 else f"{base}_{seen[base]}"
    out.append(RewardFunction(spec, name, convention_of(fn, spec), weight))
  return out


def parse_reward_config(r) -> list[RewardFunction]:
  """The `reward` section's `function` / `function_weights`, loaded; a ConfigError naming
  the field otherwise."""
  try:
    return parse_functions(r.function, r.function_weights)
  except RewardWeightsError as error:
    raise ConfigError(f"config.reward.function_weights: invalid value "
                      f"{r.function_weights!r}: {error}") from None
  except RewardFunctionError as error:
    raise ConfigError(f"config.reward.function: invalid value {r.function!r}: "
                      f"{error}") from None


def _resolved(value: Any) -> Any:
  """`value`, awaited when a coroutine (an `async def` function's result)."""
  if inspect.isawaitable(value):
    async def wait():
      return await value
    return asyncio.run(wait())
  return value


def _accepted(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
  """`kwargs` limited to the parameters `fn` names, unless it takes **kwargs (a function
  that reads only `completions` and `solution` is not handed the other columns)."""
  parameters = inspect.signature(fn).parameters
  if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
    return kwargs
  return {k: v for k, v in kwargs.items() if k in parameters}


def preload(specs: Sequence[str]) -> None:
  """Worker start-up: imports every function's module, so that a slow import (torch, a
  tokenizer) does not count against a call's deadline."""
  for spec in specs:
    load_callable(spec)


def call_trl(spec: str, kwargs: dict[str, list]) -> list:
  """Worker side: one TRL-style call over a chunk (lists of equal length), with the
  keyword arguments the function takes; the result as returned (the scorer checks it)."""
  fn = load_callable(spec)
  return _resolved(fn(**_accepted(fn, kwargs)))


def call_verl(spec: str, samples: Sequence[dict[str, Any]]) -> list:
  """Worker side: verl's compute_score once per sample of the chunk (`extra_info` only
  when it takes one)."""
  fn = load_callable(spec)
  return [_resolved(fn(**_accepted(fn, sample))) for sample in samples]
