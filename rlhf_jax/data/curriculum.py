"""Task curricula: which tasks each step's prompts come from, by a schedule in the config.

    data.curriculum = "math:1,code:1@50; math:1,code:1,arith:2"

reads: until step 50 (exclusive) half math, half code; from then on math, code and arith
in the ratio 1:1:2. Each phase is `task:weight,...` and all but the last end with
`@step`. Counts per task are exact (largest remainder, ties by task name), not sampled,
and each task's prompts come from its own resumable `PromptStream`, so the schedule and
the data position are checkpointed together (`state()` / `restore()`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from rlhf_jax.config_errors import fail
from rlhf_jax.data.jsonl import Example
from rlhf_jax.data.jsonl import PromptStream

FIELD = "data.curriculum"


@dataclasses.dataclass(frozen=True)
class Phase:
  """Until `until_step` (exclusive; None: forever), draw tasks in proportion to `weights`."""
  until_step: int | None
  weights: tuple[tuple[str, float], ...]


def parse_curriculum(text: str) -> tuple[Phase, ...]:
  """Phases of a schedule string (module docstring); ConfigError naming data.curriculum."""
  phases = []
  parts = [p.strip() for p in text.split(";")]
  if not text.strip() or any(not p for p in parts):
    fail(FIELD, f"={text!r}: expected phases 'task:weight,...@step; ...; task:weight,...'")
  previous = 0
  for number, part in enumerate(parts):
    last = number == len(parts) - 1
    mix, _, bound = part.partition("@")
    if last != (not bound):
      fail(FIELD, f"={text!r}: every phase but the last ends with '@step', the last has none "
           f"(phase {number + 1}: {part!r})")
    until = None
    if bound:
      try:
        until = int(bound.strip())
      except ValueError:
        fail(FIELD, f"={text!r}: step {bound.strip()!r} is not an integer")
      if until <= previous:
        fail(FIELD, f"={text!r}: phase bounds must increase and be > 0 (got {until} after "
             f"{previous})")
      previous = until
    weights = []
    for item in mix.split(","):
      task, _, weight = item.strip().partition(":")
      try:
        value = float(weight)
      except ValueError:
        fail(FIELD, f"={text!r}: {item.strip()!r} is not 'task:weight'")
      if not task.strip() or not value > 0:
        fail(FIELD, f"={text!r}: {item.strip()!r} needs a task name and a weight > 0")
      weights.append((task.strip(), value))
    if len({t for t, _ in weights}) != len(weights):
      fail(FIELD, f"={text!r}: a task appears twice in phase {number + 1}")
    phases.append(Phase(until, tuple(weights)))
  return tuple(phases)


def allocate(count: int, weights: Sequence[tuple[str, float]]) -> dict[str, int]:
  """`count` split by weight with the largest-remainder rule (ties: task name)."""
  total = sum(w for _, w in weights)
  shares = {task: count * w / total for task, w in weights}
  out = {task: int(np.floor(share)) for task, share in shares.items()}
  rest = count - sum(out.values())
  for task in sorted(shares, key=lambda t: (-(shares[t] - out[t]), t))[:rest]:
    out[task] += 1
  return out


class CurriculumStream:
  """A prompt stream whose task mix follows a schedule (module docstring).

  Args:
    examples: every task's examples (split by `Example.task`).
    phases: `parse_curriculum(...)`.
    seed, shuffle: as PromptStream's, per task.
  """

  def __init__(self, examples: Sequence[Example], phases: Sequence[Phase], *, seed: int = 0,
               shuffle: bool = True):
    by_task = collections.defaultdict(list)
    for example in examples:
      by_task[example.task].append(example)
    wanted = sorted({t for phase in phases for t, _ in phase.weights})
    missing = [t for t in wanted if t not in by_task]
    if missing:
      fail(FIELD, f"names task(s) {missing} that have no examples in the data "
           f"(tasks there: {sorted(by_task)})")
    self.phases = tuple(phases)
    self.seed = seed
    self.streams = {t: PromptStream(by_task[t], seed=seed + i, shuffle=shuffle)
                    for i, t in enumerate(wanted)}
    self.step = 0
    self.draws = 0
    self._mix: collections.Counter = collections.Counter()

  def set_step(self, step: int) -> None:
    """The training step the next `take`s belong to (selects the phase)."""
    self.step = int(step)

  def phase(self) -> Phase:
    """The phase of the current step."""
    for phase in self.phases:
      if phase.until_step is None or self.step < phase.until_step:
        return phase
    return self.phases[-1]

  def take(self, count: int) -> list[Example]:
    """`count` examples in the phase's exact task proportions, in a seeded order."""
    counts = allocate(count, self.phase().weights)
    batch = [e for task in sorted(counts) for e in self.streams[task].take(counts[task])]
    order = np.random.default_rng([self.seed, self.draws]).permutation(len(batch))
    self.draws += 1
    self._mix.update({t: n for t, n in counts.items() if n})
    return [batch[i] for i in order]

  def pop_mix(self) -> dict[str, int]:
    """Prompts drawn per task since the last call (the `data/task_mix/<task>` metrics)."""
    out, self._mix = dict(self._mix), collections.Counter()
    return out

  def state(self) -> dict:
    """Every task stream's position, the step and the draw count (checkpoints)."""
    return {"step": self.step, "draws": self.draws,
            "streams": {t: s.state() for t, s in self.streams.items()}}

  def restore(self, state: dict) -> None:
    """Continues from a `state()`."""
    self.step, self.draws = int(state["step"]), int(state["draws"])
    for task, stream_state in state["streams"].items():
      self.streams[task].restore(stream_state)
