"""Small pieces the reward-model launchers share: held-out splits, a tqdm bar, and the
checks of their --policy, --output and data files before any work (one-line errors)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, TypeVar

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.file_checks import check_checkpoint_dir
from rlhf_jax.file_checks import check_workdir

T = TypeVar("T")


def split_held_out(items: Sequence[T], held_out: Sequence[T] | None, fraction: float
                   ) -> tuple[list[T], list[T]]:
  """(train, held-out): `held_out` when given, else the last `fraction` of `items`."""
  if held_out is not None:
    return list(items), list(held_out)
  cut = len(items) - max(1, int(round(len(items) * fraction)))
  if cut < 1:
    raise ValueError(f"{len(items)} items are too few to hold out {fraction:.0%}.")
  return list(items[:cut]), list(items[cut:])


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[int, float], None]]:
  """A `progress(step, loss)` callback drawing a tqdm bar, closed on exit."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  bar = tqdm(total=total, desc=description, unit="step", dynamic_ncols=True)

  def progress(step: int, loss: float) -> None:
    bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.update(1)

  try:
    yield progress
  finally:
    bar.close()


def check_policy_and_output(policy: str, output: str) -> None:
  """--policy is a checkpoint directory that loads (its files, not its tensors) and
  --output can become a directory; else a ConfigError naming the flag."""
  check_checkpoint_dir(policy, f"--policy={policy}")
  check_workdir(output, "--output")


def read_flag_file(flag: str, reader: Callable[[str], T], path: str) -> T:
  """`reader(path)` for the file of --<flag>; a missing, empty or malformed file (the
  readers' OSError / ValueError, which name the file and line) is a ConfigError."""
  try:
    return reader(path)
  except (OSError, ValueError) as error:
    raise ConfigError(f"--{flag}={path}: {error}") from None
