"""A pool of worker processes whose calls have a deadline and can be killed.

Rule verifiers are ordinary Python functions (math_verify, regexes); one that hangs
or crashes must cost only its sample. Threads cannot be killed, so each call runs in
a persistent worker process; a call that passes its deadline gets its worker killed
and replaced, a worker that dies is replaced, and both are recorded as failures.
Workers are started with "spawn" (forking a process that runs JAX threads is unsafe).
A worker says it is ready before it gets its first call, so a call's deadline never
includes the worker's start-up; a worker that cannot start is an error naming the
likely cause (a script without an `if __name__ == "__main__":` guard re-runs itself
in every spawned worker), not a loop of replacements.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import signal
import time
from typing import Any, Callable, Sequence


STARTUP_TIMEOUT_S = 120.0  # spawn re-imports the parent's main module: allow a slow import
_READY = "ready"


def _serve(connection, initializer=None) -> None:
  """Worker: run `initializer` (fn, args) if any (an import that must not count against
  a call's deadline), say ready, then receive (fn, args), send ("ok", result) or
  ("error", repr). An initializer that raises is reported at start-up."""
  # A terminal's Ctrl-C reaches the whole process group: the trainer decides what it
  # means (training/loop.py finishes the step), so a call in flight must not die of it.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if initializer is not None:
    try:
      initializer[0](*initializer[1])
    except BaseException as error:  # the parent reports the worker as not started
      connection.send(("init_error", f"{type(error).__name__}: {error}"[:300]))
      return
  connection.send(_READY)
  while True:
    try:
      fn, args = connection.recv()
    except (EOFError, OSError):
      return
    try:
      reply = ("ok", fn(*args))
    except BaseException as error:  # reported, the worker lives on
      reply = ("error", f"{type(error).__name__}: {error}"[:300])
    try:
      connection.send(reply)
    except Exception as error:  # an unpicklable result
      connection.send(("error", f"unpicklable result: {error!r}"[:300]))


class WorkerStartError(RuntimeError):
  """A worker process died or hung before it could take calls."""


class _Worker:

  def __init__(self, context, initializer=None):
    self.connection, child = context.Pipe()
    self.process = context.Process(target=_serve, args=(child, initializer), daemon=True)
    self.process.start()
    child.close()
    self.ready = False

  def wait_ready(self, timeout_s: float) -> None:
    """Blocks until the worker has started; WorkerStartError if it dies or hangs first."""
    if self.ready:
      return
    message = None
    try:
      if self.connection.poll(timeout_s):
        message = self.connection.recv()
    except (EOFError, OSError):
      pass
    if isinstance(message, tuple) and message[0] == "init_error":
      self.kill()
      raise WorkerStartError(f"a worker process could not start: {message[1]}")
    if message != _READY:
      exitcode = self.process.exitcode
      self.kill()
      state = (f"exited with code {exitcode}" if exitcode is not None
               else f"did not start within {timeout_s:.0f} s")
      raise WorkerStartError(
          f"a worker process (of the verifiers or environments) {state}. Workers are "
          "started with multiprocessing "
          "'spawn', which imports the main module again in each worker: a script must "
          "run its work under `if __name__ == \"__main__\":`.")
    self.ready = True

  def kill(self) -> None:
    self.process.kill()
    self.process.join()
    self.connection.close()


class KillablePool:
  """Runs `fn(*args)` calls on `size` worker processes, each call within `timeout_s`.

  Args:
    size: worker processes (started lazily on the first `map`).
    timeout_s: per-call limit, from when the call reaches a started worker.
    startup_timeout_s: how long a new worker may take to start (its initializer included).
    initializer: (fn, args) each worker runs before it takes calls (e.g. importing a
      reward function's module), or None.
  """

  def __init__(self, size: int, timeout_s: float, startup_timeout_s: float = STARTUP_TIMEOUT_S,
               initializer: tuple[Callable, tuple] | None = None):
    if size < 1 or timeout_s <= 0:
      raise ValueError(f"KillablePool needs size >= 1 and timeout_s > 0; got {size}, "
                       f"{timeout_s}.")
    self.size, self.timeout_s, self.startup_timeout_s = size, timeout_s, startup_timeout_s
    self.initializer = initializer
    self._context = multiprocessing.get_context("spawn")
    self._workers: list[_Worker] = []

  @staticmethod
  def check_picklable(fn: Callable, name: str) -> None:
    """Raises ValueError if `fn` cannot be sent to a worker (lambdas, closures)."""
    try:
      pickle.dumps(fn)
    except Exception as error:
      raise ValueError(f"verifier {name!r} must be a module-level function (or a "
                       f"functools.partial of one) to run in a worker process: {error}") from None

  def map(self, calls: Sequence[tuple[Callable, tuple]]) -> list[tuple[str, Any]]:
    """Runs the calls; per call ("ok", result), ("error", why) or ("timeout", "")."""
    while len(self._workers) < min(self.size, len(calls)):
      self._workers.append(_Worker(self._context, self.initializer))
    for worker in self._workers:  # started together, waited for together
      worker.wait_ready(self.startup_timeout_s)
    results: list[tuple[str, Any] | None] = [None] * len(calls)
    pending = list(range(len(calls)))[::-1]
    busy: dict[int, tuple[int, float]] = {}  # worker slot → (call index, deadline)
    idle = list(range(len(self._workers)))
    while pending or busy:
      while pending and idle:
        slot, index = idle.pop(), pending.pop()
        try:
          self._workers[slot].wait_ready(self.startup_timeout_s)  # a replacement may be new
          self._workers[slot].connection.send(calls[index])
        except (OSError, ValueError):  # the worker died between calls
          self._replace(slot)
          self._workers[slot].wait_ready(self.startup_timeout_s)
          self._workers[slot].connection.send(calls[index])
        busy[slot] = (index, time.monotonic() + self.timeout_s)
      deadline = min(d for _, d in busy.values())
      ready = multiprocessing.connection.wait(
          [self._workers[s].connection for s in busy], max(0.0, deadline - time.monotonic()))
      for slot in list(busy):
        index, deadline = busy[slot]
        worker = self._workers[slot]
        if worker.connection in ready:
          try:
            results[index] = worker.connection.recv()
          except (EOFError, OSError):
            worker.process.join(1.0)  # its pipe closes before it is reaped: wait for the code
            results[index] = ("error", f"worker died (exit code {worker.process.exitcode})")
            self._replace(slot)
        elif time.monotonic() >= deadline:
          results[index] = ("timeout", "")
          self._replace(slot)
        else:
          continue
        del busy[slot]
        idle.append(slot)
    return results  # type: ignore[return-value]

  def _replace(self, slot: int) -> None:
    self._workers[slot].kill()
    self._workers[slot] = _Worker(self._context, self.initializer)

  def close(self) -> None:
    """Stops the workers."""
    for worker in self._workers:
      worker.kill()
    self._workers = []
