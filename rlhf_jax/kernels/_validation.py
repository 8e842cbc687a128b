"""Entry checks shared by the kernels.

Array checks (`chex.assert_*`) run at trace time and cost nothing under `jit`.
Option checks run on Python values only: a traced option (e.g. a per-row `lam`
array) cannot be inspected without a host round-trip, so it is passed through.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import chex
import jax.numpy as jnp


def check_choice(name: str, value: Any, allowed: Iterable[str], hint: str = "") -> None:
  """Raises ValueError naming `name` if `value` is not one of `allowed`."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise ValueError(
        f"{name}={value!r} is not supported; allowed values: "
        f"{', '.join(repr(a) for a in allowed)}.{(' ' + hint) if hint else ''}")


def check_range(name: str, value: Any, *, low: float | None = None,
                high: float | None = None, low_inclusive: bool = True,
                high_inclusive: bool = True) -> None:
  """Raises ValueError naming `name` if the Python number `value` is out of range.

  Arrays (including tracers) are not inspected.
  """
  if not isinstance(value, numbers.Real) or isinstance(value, bool):
    return
  ok = True
  if low is not None:
    ok &= value >= low if low_inclusive else value > low
  if high is not None:
    ok &= value <= high if high_inclusive else value < high
  if not ok:
    lo = "" if low is None else ("[" if low_inclusive else "(") + f"{low}"
    hi = "" if high is None else f"{high}" + ("]" if high_inclusive else ")")
    if low is None:
      interval = f"<= {high}" if high_inclusive else f"< {high}"
    elif high is None:
      interval = f">= {low}" if low_inclusive else f"> {low}"
    else:
      interval = f"in {lo}, {hi}"
    raise ValueError(f"{name}={value!r} must be {interval}.")


def check_batch_time(*arrays: chex.Array, names: Iterable[str]) -> None:
  """Checks that every array is rank 2 and that all have one shape [B, T]."""
  names = tuple(names)
  for array, name in zip(arrays, names):
    if jnp.ndim(array) != 2:
      raise ValueError(
          f"{name} must be a [batch, time] array; got shape {jnp.shape(array)}.")
  shapes = {name: jnp.shape(a) for a, name in zip(arrays, names)}
  if len(set(shapes.values())) > 1:
    raise ValueError(f"shape mismatch between [batch, time] arrays: {shapes}.")


def check_per_row(array: chex.Array, name: str, batch: int) -> None:
  """Checks that `array` is a [B] vector for a batch of `batch` rows."""
  if jnp.shape(array) != (batch,):
    raise ValueError(
        f"{name} must have shape [batch]=({batch},); got {jnp.shape(array)}.")


def check_floating(array: chex.Array, name: str) -> None:
  """Checks that `array` holds floating-point values."""
  if not jnp.issubdtype(jnp.result_type(array), jnp.floating):
    raise TypeError(f"{name} must be a floating-point array; got "
                    f"{jnp.result_type(array)}.")


def check_integer(array: chex.Array, name: str) -> None:
  """Checks that `array` holds integer values (token ids)."""
  if not jnp.issubdtype(jnp.result_type(array), jnp.integer):
    raise TypeError(f"{name} must be an integer array; got {jnp.result_type(array)}.")


def as_float32(*arrays: chex.Array):
  """Upcasts arrays to float32 (bfloat16 inputs are accumulated in float32)."""
  out = tuple(jnp.asarray(a, jnp.float32) for a in arrays)
  return out[0] if len(out) == 1 else out
