"""Holding a Scheduler's loop until the event under test has happened, through its
`step_hook`: a test that acts on running samples (a swap, a cancel, a refused call)
then acts between two decode steps whatever the machine's load, instead of hoping its
call lands before the samples finish."""

from __future__ import annotations

import threading
from typing import Callable

from rlhf_jax.sampling.scheduler.scheduler import Scheduler


class Hold:
  """Holds `scheduler`'s loop at the start of the first step at which
  `when(scheduler.metrics())` is true (None: once a token was drawn, and read by the
  host, since the `with` block began), until `release` or the end of the block.

    with Hold(service.scheduler) as hold:
      future = client.submit(prompt, params)
      hold.wait()  # the loop is held: the samples drew tokens and still run
      client.update_params(new_params, version=1)  # lands mid-sample
    future.result()

  A hold never released within `timeout_s` raises TimeoutError in the loop's thread
  (the server fails its requests), so a broken test ends instead of hanging. A hook
  already set (a `StepCount`) still runs at every step, and is set back at the end.
  """

  def __init__(self, scheduler: Scheduler,
               when: Callable[[dict[str, float]], bool] | None = None,
               timeout_s: float = 60.0):
    self.scheduler = scheduler
    self.when = when
    self.timeout_s = timeout_s
    self.holding = threading.Event()
    self.released = threading.Event()
    self.outer = None

  def __enter__(self) -> Hold:
    if self.when is None:
      drawn = self.scheduler.metrics()["generated_tokens"]
      self.when = lambda metrics: metrics["generated_tokens"] > drawn
    self.outer, self.scheduler.step_hook = self.scheduler.step_hook, self._step
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()
    self.scheduler.step_hook = self.outer

  def _step(self, scheduler: Scheduler) -> None:
    if self.outer is not None:
      self.outer(scheduler)
    if self.released.is_set() or not self.when(scheduler.metrics()):
      return
    self.holding.set()
    if not self.released.wait(self.timeout_s):
      raise TimeoutError(f"a test held the scheduler's step for {self.timeout_s} s")

  def wait(self) -> None:
    """Returns once the loop is held; fails the test if it is not within timeout_s."""
    assert self.holding.wait(self.timeout_s), "the scheduler's loop never reached the hold"

  def release(self) -> None:
    """Lets the loop go on (it does not hold again)."""
    self.released.set()


def cancel_arrived(scheduler: Scheduler, monkeypatch, request_id: str) -> threading.Event:
  """An Event set once `scheduler.cancel(request_id, ...)` has run: a disconnecting
  client's cancel reaches the scheduler on a gRPC thread, after the client's call has
  returned (and a finished call's cancel may come late: hence one request's)."""
  arrived = threading.Event()
  original = scheduler.cancel

  def cancel(cancelled_id, *args, **kwargs):
    original(cancelled_id, *args, **kwargs)
    if cancelled_id == request_id:
      arrived.set()

  monkeypatch.setattr(scheduler, "cancel", cancel)
  return arrived


class StepCount:
  """Counts `scheduler`'s steps (its `step_hook`): how long a request waited, in the
  scheduler's own unit, which the machine's load does not change."""

  def __init__(self, scheduler: Scheduler):
    self.steps = 0
    scheduler.step_hook = self._step

  def _step(self, scheduler: Scheduler) -> None:
    self.steps += 1

  def of(self, call: Callable[[], object]) -> int:
    """The steps the scheduler ran while `call()` ran."""
    start = self.steps
    call()
    return self.steps - start
