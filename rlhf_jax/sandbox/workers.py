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

A pool made with `plain_results` never unpickles what a worker sends back: the worker
sends its reply as JSON (numbers, strings, None, lists and dicts of them), bounded in
size, so a crafted result object of user code cannot run anything in the trainer. A
`GroupPool` runs each worker as the leader of a process group (sandbox/worker_groups.py):
replacing or closing a worker kills what its user code started.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
from typing import Any, Callable, Sequence

from rlhf_jax.sandbox import worker_groups


STARTUP_TIMEOUT_S = 120.0  # spawn re-imports the parent's main module: allow a slow import
MAX_PLAIN_RESULT_BYTES = 64 * 2**20  # a plain result's JSON: larger is an error, not memory
_READY = "ready"


def describe_error(error: BaseException) -> str:
  """"Type: message" of an exception raised by user code, at most 300 characters; an
  exception whose `__str__` itself raises is described by its type alone."""
  try:
    name = type(error).__name__
  except BaseException:  # pylint: disable=broad-except
    name = "exception"
  try:
    text = f"{name}: {error}"
  except BaseException:  # pylint: disable=broad-except  # a hostile __str__
    text = f"{name} (its message could not be read)"
  return text[:300]


def _send(connection, reply, plain: bool) -> None:
  """A reply to the parent: pickled, or (plain) as JSON bytes; a result that cannot be
  sent becomes an error reply."""
  if not plain:
    try:
      connection.send(reply)
    except Exception as error:  # an unpicklable result
      connection.send(("error", f"unpicklable result: {describe_error(error)}"[:300]))
    return
  try:
    data = json.dumps(reply).encode()
  except Exception as error:  # pylint: disable=broad-except
    data = json.dumps(["error", f"result is not plain data: {describe_error(error)}"]).encode()
  if len(data) > MAX_PLAIN_RESULT_BYTES:
    data = json.dumps(["error", f"result of {len(data)} bytes is over the "
                                f"{MAX_PLAIN_RESULT_BYTES}-byte limit"]).encode()
  connection.send_bytes(data)


def _serve(connection, initializer=None, plain: bool = False) -> None:
  """Worker: run `initializer` (fn, args) if any (an import that must not count against
  a call's deadline), say ready, then receive (fn, args), send ("ok", result) or
  ("error", "Type: message") (as JSON when `plain`). An initializer that raises is
  reported at start-up."""
  # A terminal's Ctrl-C reaches the whole process group: the trainer decides what it
  # means (training/loop.py finishes the step), so a call in flight must not die of it.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # In plain mode even the start-up messages are JSON: the initializer runs user code
  # (a reward function's import), which must not get a pickle to the parent either.
  say = ((lambda message: connection.send_bytes(json.dumps(message).encode())) if plain
         else connection.send)
  if initializer is not None:
    try:
      initializer[0](*initializer[1])
    except BaseException as error:  # the parent reports the worker as not started
      say(["init_error", describe_error(error)])
      return
  say(_READY)
  while True:
    try:
      fn, args = connection.recv()
    except (EOFError, OSError):
      return
    try:
      reply = ("ok", fn(*args))
    except BaseException as error:  # reported, the worker lives on
      reply = ("error", describe_error(error))
    _send(connection, reply, plain)


class _MalformedReply(ValueError):
  """A plain-mode reply that is not the [status, value] JSON a worker of ours sends."""


class WorkerStartError(RuntimeError):
  """A worker process died or hung before it could take calls."""


class _Worker:

  def __init__(self, context, initializer=None, plain: bool = False):
    self.plain = plain
    self.connection, child = context.Pipe()
    self.process = context.Process(target=_serve, args=(child, initializer, plain),
                                   daemon=True)
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
        message = (json.loads(self.connection.recv_bytes(4096)) if self.plain
                   else self.connection.recv())
    except (EOFError, OSError):
      pass
    except ValueError:  # plain mode: not JSON, which no worker of ours sends
      self.kill()
      raise WorkerStartError("a worker process sent a malformed start-up message (its "
                             "initializer's user code wrote to the worker's pipe)") from None
    if isinstance(message, (tuple, list)) and len(message) == 2 and message[0] == "init_error":
      self.kill()
      raise WorkerStartError(f"a worker process could not start: {str(message[1])[:300]}")
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
    plain_results: results come back as JSON, never unpickled (module docstring): a call's
      result must be numbers, strings, None, lists and dicts of them.
  """

  def __init__(self, size: int, timeout_s: float, startup_timeout_s: float = STARTUP_TIMEOUT_S,
               initializer: tuple[Callable, tuple] | None = None,
               plain_results: bool = False):
    if size < 1 or timeout_s <= 0:
      raise ValueError(f"KillablePool needs size >= 1 and timeout_s > 0; got {size}, "
                       f"{timeout_s}.")
    self.size, self.timeout_s, self.startup_timeout_s = size, timeout_s, startup_timeout_s
    self.initializer = initializer
    self.plain_results = plain_results
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
      self._workers.append(self._new_worker())
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
            results[index] = self._receive(worker)
          except _MalformedReply as malformed:  # the stream cannot be trusted after it
            results[index] = ("error", f"worker sent a malformed reply ({malformed})")
            self._replace(slot)
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

  def _new_worker(self) -> _Worker:
    return _Worker(self._context, self.initializer, self.plain_results)

  def _receive(self, worker: _Worker) -> tuple[str, Any]:
    """A worker's reply: unpickled, or (plain_results) parsed from JSON."""
    if not self.plain_results:
      return worker.connection.recv()
    # maxlength: a reply longer than the worker may send is a broken worker (OSError).
    data = worker.connection.recv_bytes(MAX_PLAIN_RESULT_BYTES + 1024)
    try:
      reply = json.loads(data)
    except ValueError:
      raise _MalformedReply("not JSON") from None
    if (not isinstance(reply, list) or len(reply) != 2
        or reply[0] not in ("ok", "error")):
      raise _MalformedReply("not a [status, value] pair")
    if reply[0] == "error" and not isinstance(reply[1], str):
      raise _MalformedReply("an error without a reason")
    return reply[0], reply[1]

  def _replace(self, slot: int) -> None:
    self._workers[slot].kill()
    self._workers[slot] = self._new_worker()

  def close(self) -> None:
    """Stops the workers."""
    for worker in self._workers:
      worker.kill()
    self._workers = []


class GroupPool(KillablePool):
  """A KillablePool whose workers lead their own process groups with a memory watchdog
  (sandbox/worker_groups.py): replacing or closing a worker kills everything its user code
  started, and a worker past `memory_mb` ends itself (its call fails with "worker died
  (exit code MEMORY_EXIT_CODE)").

  Args:
    size: worker processes, as KillablePool's.
    timeout_s: per-call limit, as KillablePool's.
    memory_mb: the resident limit of a worker's group (0: none).
    initializer: (fn, args) run in the worker after it leads its group and its watchdog
      runs, or None.
    **kwargs: KillablePool's other arguments (`plain_results`, `startup_timeout_s`).
  """

  def __init__(self, size: int, timeout_s: float, *, memory_mb: int = 0,
               initializer: tuple[Callable, tuple] | None = None, **kwargs):
    super().__init__(size, timeout_s, initializer=(_start_group_worker, (
        memory_mb, os.getpid(), initializer)), **kwargs)

  def _replace(self, slot: int) -> None:
    worker_groups.kill_group(self._workers[slot].process.pid)
    super()._replace(slot)

  def close(self) -> None:
    """Stops the workers and their process groups."""
    for worker in self._workers:
      worker_groups.kill_group(worker.process.pid)
    super().close()


def _start_group_worker(memory_mb: int, parent: int, initializer) -> None:
  worker_groups.start_worker(memory_mb, parent)
  if initializer is not None:
    initializer[0](*initializer[1])
