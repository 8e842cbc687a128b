"""Small pieces the launchers share: held-out splits, the progress display (a tqdm bar on a
terminal, plain lines in a log file), and the checks of the reward-model launchers'
--policy, --output and data files before any work (one-line errors)."""

from __future__ import annotations

import contextlib
import sys
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


def on_terminal() -> bool:
  """Whether stdout and stderr are both terminals, where a progress bar can redraw itself;
  in a log file or a pipe its carriage returns make one unreadable line."""
  return all(stream is not None and hasattr(stream, "isatty") and stream.isatty()
             for stream in (sys.stdout, sys.stderr))


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[int, float], None]]:
  """A `progress(step, loss)` callback, closed on exit: a tqdm bar on a terminal; else
  (`on_terminal` False) one plain line per step on stdout, "<description> step 3/100:
  loss 0.1234" (`step` counts from 0, as optim/fit.py calls it)."""
  if not on_terminal():
    def plain(step: int, loss: float) -> None:
      print(f"{description} step {step + 1}/{total}: loss {loss:.4f}", flush=True)

    yield plain
    return
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  bar = tqdm(total=total, desc=description, unit="step", dynamic_ncols=True)

  def progress(step: int, loss: float) -> None:
    del step  # the bar counts
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
