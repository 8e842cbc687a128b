"""Reward functions of one's own: `reward.function = "package.module:fn"` (several as
"a:f,b:g", weighted by `reward.function_weights`), in the signatures other libraries use.

Two conventions, told apart by the function's parameter names:

  TRL (also tunix, MaxText)   fn(prompts, completions, **columns) -> list[float | None]
      called once per step with keyword lists over its samples: `prompts` (the prompt text as
      the model saw it, chat template applied), `completions` (the decoded responses),
      `completion_ids` (their tokens), and every column of the rows under its own name:
      ours (`answer`, `task`) and the file's own (`solution`, `data_source`, ...).
  verl                        compute_score(data_source, solution_str, ground_truth,
                                            extra_info=None) -> float | dict
      called once per sample; a dict's "score" is the reward, its other numbers are logged.

A TRL function gets the whole step's samples in one call, in row order (as TRL calls it per
batch: a function that normalises or ranks across the batch sees all of it); a verl
function is called once per sample. A result may be a list, a tuple or a NumPy/JAX array.
`async def` functions are awaited on one event loop per worker, kept for the worker's life
(a module-level `asyncio.Semaphore` or async HTTP client stays bound to it). `None` means
"not scored by this function": the reward is Σ weight × value over the functions that
scored the sample (TRL's nansum); a sample that none scores gets `reward.unscored`.

Functions run in killable worker processes (sandbox/workers.py `GroupPool`), each call
within `reward.function_timeout_s`, as environments run: every process a call starts is
killed when the call ends, the worker's memory is watched (`reward.worker_memory_mb`), what
the function prints is captured (at most `OUTPUT_BYTES` kept, shown once per step), and the
result crosses back as plain data (numbers, None, dicts of numbers), never a pickle. An
exception, a hang, a wrong type or length fails those samples with a one-line reason
(rewards/function_scorer.py reports them), never the run.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import math
import numbers
import os
import sys
import threading
from typing import Any, Callable, Sequence

from rlhf_jax.config_errors import invalid
from rlhf_jax.registry import Registry
from rlhf_jax.sandbox import worker_groups
from rlhf_jax.sandbox.workers import describe_error

VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")
VERL_SAMPLES_PER_CALL = 16  # a verl call's chunk of samples: a hang costs at most these
OUTPUT_BYTES = 4096  # of what a call prints, kept and shown; the rest is counted only
_MAX_EXTRAS = 32  # numeric entries of a verl dict result kept for the metrics


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


# `reward.function`: named by "package.module:fn" only, since each reward worker (a
# spawned process) loads it again, where a name registered in the parent is unknown.
REWARD_FUNCTIONS: Registry[Callable] = Registry("reward function", "reward.function",
                                                collections.abc.Callable, what="function",
                                                by_name=False)


@functools.lru_cache(maxsize=None)
def load_callable(spec: str) -> Callable:
  """The callable of "module:name" (or "file.py:name"), by the one loader of every
  `module:name` (`REWARD_FUNCTIONS.resolve`: the working directory on the path, where it
  looked when not found); RewardFunctionError naming what is wrong: no colon, a module
  that does not import, a missing or non-callable name."""
  return REWARD_FUNCTIONS.resolve(spec, error=RewardFunctionError)


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
    invalid("reward.function_weights", r.function_weights, str(error))
  except RewardFunctionError as error:
    invalid("reward.function", r.function, str(error))


_LOOP: asyncio.AbstractEventLoop | None = None  # the worker's one event loop


def _event_loop() -> asyncio.AbstractEventLoop:
  """The worker's event loop, made on first use and kept (and set as the thread's current
  loop, so module-level asyncio objects bind to it)."""
  global _LOOP  # pylint: disable=global-statement
  if _LOOP is None or _LOOP.is_closed():
    _LOOP = asyncio.new_event_loop()
    asyncio.set_event_loop(_LOOP)
  return _LOOP


def _resolved(value: Any) -> Any:
  """`value`, awaited on the worker's event loop when it is awaitable (an `async def`
  function's result)."""
  if inspect.isawaitable(value):
    async def wait():
      return await value
    return _event_loop().run_until_complete(wait())
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


class _Output:
  """What a call printed (stdout and stderr, of the worker and the processes it started):
  the first `OUTPUT_BYTES` kept, every byte counted."""

  def __init__(self):
    self.kept = bytearray()
    self.total = 0

  def drain(self, fd: int) -> None:
    """Reads `fd` to its end, then closes it (the thread owns it: a process that escaped
    the group may hold the pipe open past the call, and the fd must not be reused then)."""
    try:
      while chunk := os.read(fd, 65536):
        self.total += len(chunk)
        if len(self.kept) < OUTPUT_BYTES:
          self.kept += chunk[:OUTPUT_BYTES - len(self.kept)]
    finally:
      os.close(fd)

  def text(self) -> str:
    return bytes(self.kept).decode("utf-8", "replace")


@contextlib.contextmanager
def _guarded_call():
  """Worker side, around one call: file descriptors 1 and 2 go to a pipe that a thread
  drains (bounded memory, however much is printed); afterwards the processes the call
  started are killed and the descriptors restored."""
  output = _Output()
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  read_end, write_end = os.pipe()
  saved = [os.dup(1), os.dup(2)]
  reader = threading.Thread(target=output.drain, args=(read_end,), daemon=True)
  reader.start()
  os.dup2(write_end, 1)
  os.dup2(write_end, 2)
  os.close(write_end)
  try:
    yield output
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except  # a closed stream
        pass
    worker_groups.end_call()  # what the call started holds the pipe open: end it first
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in saved:
      os.close(fd)
    reader.join(1.0)  # the reader closes read_end itself


def _safe_repr(value: Any) -> str:
  try:
    return repr(value)[:80]
  except BaseException:  # pylint: disable=broad-except  # a hostile __repr__
    return "(unreadable)"


def plain_value(value: Any) -> float | None | dict[str, str]:
  """A returned reward as plain data: a float (NaN and inf kept: the scorer refuses them
  by name), None, or {"bad": "<type> <repr>"} for anything else. NumPy and JAX scalars
  are numbers."""
  if value is None:
    return None
  if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
    try:
      return float(value)
    except Exception:  # pylint: disable=broad-except  # an int beyond float64, a hostile __float__
      pass
  return {"bad": f"{type(value).__name__} {_safe_repr(value)}"}


def plain_list(result: Any) -> list | None:
  """A TRL function's result as a list of `plain_value`s: a list, a tuple or a 1-D
  NumPy/JAX array; None for anything else."""
  if isinstance(result, (list, tuple)):
    return [plain_value(v) for v in result]
  if hasattr(result, "tolist") and getattr(result, "ndim", None) == 1:
    return [plain_value(v) for v in result.tolist()]
  return None


def _plain_verl(value: Any) -> Any:
  """One verl result as plain data: `plain_value`, or for a dict {"dict": {key: value}}
  (its "score", "acc" and up to `_MAX_EXTRAS` numeric entries)."""
  if not isinstance(value, dict):
    return plain_value(value)
  keys = [k for k in value if isinstance(k, str)]
  kept = {k: value[k] for k in keys if k in ("score", "acc")}
  kept.update({k: value[k] for k in keys[:_MAX_EXTRAS] if k not in kept})
  out = {}
  for key, item in kept.items():  # a bool stays one only as the verdict ("acc")
    out[key] = bool(item) if key == "acc" and isinstance(item, bool) else plain_value(item)
  return {"dict": out, "keys": sorted(keys)[:8]}


def _report(output: _Output, **fields) -> dict[str, Any]:
  return {**fields, "output": output.text(), "output_bytes": output.total}


def call_trl(spec: str, kwargs: dict[str, list]) -> dict[str, Any]:
  """Worker side: one TRL-style call over the step's samples (lists of equal length),
  with the keyword arguments the function takes. Returns plain data: {"values": per
  sample a `plain_value`, or None when the result is no list, "error": "" or why the call
  failed, "output": what it printed (first OUTPUT_BYTES), "output_bytes": how much}."""
  fn = load_callable(spec)
  result, raised = None, ""
  with _guarded_call() as output:
    try:
      result = _resolved(fn(**_accepted(fn, kwargs)))
    except BaseException as error:  # pylint: disable=broad-except  # user code
      raised = f"raised {describe_error(error)}"
  # Reported after the block: only then is everything the call printed read.
  if raised:
    return _report(output, values=None, error=raised)
  values = plain_list(result)
  error = "" if values is not None else (f"returned {type(result).__name__}, not a list of "
                                         "rewards")
  return _report(output, values=values, error=error)


def call_verl(spec: str, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Worker side: verl's compute_score once per sample of the chunk (`extra_info` only
  when it takes one). Returns {"values": per sample its plain result or {"error": why},
  "error": "", "output", "output_bytes"} (`call_trl`'s form)."""
  fn = load_callable(spec)
  values = []
  with _guarded_call() as output:
    for sample in samples:
      try:
        values.append(_plain_verl(_resolved(fn(**_accepted(fn, sample)))))
      except BaseException as error:  # pylint: disable=broad-except  # user code
        values.append({"error": f"raised {describe_error(error)}"})
  return _report(output, values=values, error="")
