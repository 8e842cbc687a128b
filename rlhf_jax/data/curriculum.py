"""Task curricula: which tasks each step's prompts come from, by a schedule in the config.

    data.curriculum = "math:1,code:1@50; math:1,code:1,arith:2"

reads: until step 50 (exclusive) half math, half code; from then on math, code and arith
in the ratio 1:1:2. Each phase is `task:weight,...` and all but the last end with
`@step`. Counts per task are exact, not sampled: a `take(n)` splits n by the weights with
the largest-remainder rule (ties by task name). Within a phase the rounding error carries
over from one take to the next, so takes whose shares are fractional (7 prompts 1:1, or
the one-at-a-time refills of a windowed rollout) still follow the weights over the phase
instead of always favouring the first name. Each task's prompts come from its own
resumable `PromptStream`; the schedule position and the data positions are checkpointed
together (`state()` / `restore()`).
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import math
import zlib
from typing import Mapping, Sequence

import numpy as np

from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import unfit
from rlhf_jax.data.example import Example
from rlhf_jax.data.jsonl import PromptStream

FIELD = "data.curriculum"


@dataclasses.dataclass(frozen=True)
class Phase:
  """Until `until_step` (exclusive; None: forever), draw tasks in proportion to `weights`."""
  until_step: int | None
  weights: tuple[tuple[str, float], ...]


Curriculum = tuple[Phase, ...]


def parse_curriculum(text: str) -> Curriculum:
  """Phases of a schedule string (module docstring); ConfigError naming data.curriculum."""
  phases = []
  parts = [p.strip() for p in text.split(";")]
  if not text.strip() or any(not p for p in parts):
    invalid(FIELD, text, "expected phases 'task:weight,...@step; ...; task:weight,...'")
  previous = 0
  for number, part in enumerate(parts, 1):
    last = number == len(parts)
    mix, has_bound, bound = part.partition("@")
    if last == bool(has_bound):
      invalid(FIELD, text, f"every phase but the last ends with '@step', the last has none "
              f"(phase {number}: {part!r})")
    until = None
    if not last:
      try:
        until = int(bound.strip())
      except ValueError:
        invalid(FIELD, text, f"step {bound.strip()!r} is not an integer")
      if until <= previous:
        invalid(FIELD, text, f"phase bounds must increase and be > 0 (got {until} after "
                f"{previous})")
      previous = until
    weights = []
    for item in mix.split(","):
      task, _, weight = (s.strip() for s in item.partition(":"))
      try:
        value = float(weight)
      except ValueError:
        invalid(FIELD, text, f"{item.strip()!r} is not 'task:weight'")
      if not task or not (value > 0 and math.isfinite(value)):
        invalid(FIELD, text, f"{item.strip()!r} needs a task name and a finite weight > 0")
      weights.append((task, value))
    if len({t for t, _ in weights}) != len(weights):
      invalid(FIELD, text, f"a task appears twice in phase {number}")
    phases.append(Phase(until, tuple(weights)))
  return tuple(phases)


def allocate(count: int, weights: Sequence[tuple[str, float]],
             drawn: Mapping[str, int] | None = None) -> dict[str, int]:
  """`count` split by weight with the largest-remainder rule (ties: task name).

  Args:
    count: how many to split.
    weights: (task, weight > 0) pairs.
    drawn: per task, how many were drawn before in this schedule phase; the split then
      makes up for the earlier rounding (the quota of a task is its share of everything
      drawn so far plus `count`, less what it got). None: a fresh split.

  Returns:
    Per task (every task of `weights`), a count ≥ 0; they sum to `count`.
  """
  drawn = drawn or {}
  total = sum(fractions.Fraction(w) for _, w in weights)
  overall = count + sum(drawn.get(t, 0) for t, _ in weights)
  quota = {t: overall * fractions.Fraction(w) / total - drawn.get(t, 0) for t, w in weights}
  out = {t: max(math.floor(q), 0) for t, q in quota.items()}
  while sum(out.values()) < count:  # the largest remainders first, ties by name
    out[min(out, key=lambda t: (out[t] - quota[t], t))] += 1
  while sum(out.values()) > count:  # only where an earlier take overshot: the most served
    out[min((t for t in out if out[t]), key=lambda t: (quota[t] - out[t], t))] -= 1
  return out


def _task_seed(seed: int, task: str) -> int:
  """A task's stream seed: independent of which other tasks the schedule names."""
  return seed * 2**32 + zlib.crc32(task.encode("utf-8"))


class CurriculumStream:
  """A prompt stream whose task mix follows a schedule (module docstring).

  Examples of tasks the schedule never names are not drawn.

  Args:
    examples: every task's examples (split by `Example.task`).
    curriculum: `parse_curriculum(...)`.
    seed: seeds each task's shuffle and the interleaving of each take.
    shuffle: as PromptStream's, per task.
  """

  def __init__(self, examples: Sequence[Example], curriculum: Sequence[Phase], *,
               seed: int = 0, shuffle: bool = True):
    by_task = collections.defaultdict(list)
    for example in examples:
      by_task[example.task].append(example)
    wanted = sorted({t for phase in curriculum for t, _ in phase.weights})
    missing = [t for t in wanted if t not in by_task]
    if missing:
      unfit(FIELD, f"names task(s) {missing} that have no examples in the data "
            f"(tasks there: {sorted(by_task)})")
    self.phases = tuple(curriculum)
    self.seed = seed
    self.streams = {t: PromptStream(by_task[t], seed=_task_seed(seed, t), shuffle=shuffle)
                    for t in wanted}
    self.step = 0
    self.draws = 0  # takes so far (seeds each take's interleaving)
    self.counts_phase = 0  # the phase `counts` belong to
    self.counts: dict[str, int] = {}  # per task, prompts drawn in that phase
    self._mix: collections.Counter = collections.Counter()

  def set_step(self, step: int) -> None:
    """The training step the next `take`s belong to (selects the phase)."""
    self.step = int(step)

  def phase_index(self) -> int:
    """The index of the current step's phase."""
    for index, phase in enumerate(self.phases):
      if phase.until_step is None or self.step < phase.until_step:
        return index
    return len(self.phases) - 1

  def phase(self) -> Phase:
    """The current step's phase."""
    return self.phases[self.phase_index()]

  def take(self, count: int) -> list[Example]:
    """`count` examples in the phase's task proportions (`allocate`), in a seeded order."""
    index = self.phase_index()
    if index != self.counts_phase:
      self.counts_phase, self.counts = index, {}
    counts = allocate(count, self.phases[index].weights, self.counts)
    batch = [e for task in sorted(counts) for e in self.streams[task].take(counts[task])]
    order = np.random.default_rng([self.seed, self.draws]).permutation(len(batch))
    self.draws += 1
    for task, n in counts.items():
      self.counts[task] = self.counts.get(task, 0) + n
    self._mix.update({t: n for t, n in counts.items() if n})
    return [batch[i] for i in order]

  def pop_mix(self) -> dict[str, int]:
    """Prompts drawn per task since the last call (the `data/task_mix/<task>` metrics; a
    rollout may `take` more than once a step)."""
    out, self._mix = dict(self._mix), collections.Counter()
    return out

  def state(self) -> dict:
    """The step, the take count, the phase's counts and every task stream's position."""
    return {"step": self.step, "draws": self.draws, "counts_phase": self.counts_phase,
            "counts": dict(self.counts),
            "streams": {t: s.state() for t, s in self.streams.items()}}

  def restore(self, state: dict) -> None:
    """Continues from a `state()`; tasks the schedule no longer names are dropped, new ones
    start from the beginning."""
    if "streams" not in state:
      raise ValueError(f"not a CurriculumStream state (keys {sorted(state)}); a checkpoint "
                       "of a run without data.curriculum resumes only without one.")
    self.step, self.draws = int(state["step"]), int(state["draws"])
    self.counts_phase = int(state.get("counts_phase", 0))
    self.counts = {t: int(n) for t, n in state.get("counts", {}).items()}
    for task, stream_state in state["streams"].items():
      if task in self.streams:
        self.streams[task].restore(stream_state)
