"""Small pieces the reward-model launchers share: held-out splits and a tqdm bar."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, TypeVar

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
