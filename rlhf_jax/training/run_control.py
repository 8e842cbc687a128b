"""What keeps a training run's workdir consistent when people and machines interfere.

- `check_workdir`: the run's directory is one, or can be made one (no regular file in its
  place or above it), checked before any work.
- `WorkdirLock`: one trainer per workdir. A second one is refused in one line naming the
  holder (pid, host, start time); two trainers would interleave their records and
  checkpoints. `fcntl.flock` on <workdir>/trainer.lock, held for the trainer's life: the
  kernel releases it when the holder exits however it exits, so a file left by a dead
  process blocks nothing.
- `StopSignals`: SIGINT and SIGTERM only set a flag, which the loop reads where the
  step's records are complete (then it saves and stops); a second SIGINT interrupts at
  once (KeyboardInterrupt), for a run that must not wait.
- `Stopped`: how the loop ends a run early on purpose (a signal, every sampling server
  gone) after saying why in one line: a SystemExit with a non-zero status, so a
  launcher exits without a traceback.
- `run_to_end`: the lifecycle around the trainer's loop (training/loop.py): the signals,
  a lost fleet, the loggers' end, the exported policy, the lock's release.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import signal
import socket
import threading
import time
from typing import Any

from rlhf_jax import parallel
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import unfit
from rlhf_jax.sampling.protocol import SamplerUnavailable

LOCK_FILE = "trainer.lock"


class WorkdirBusy(ConfigError):
  """Another live process holds the workdir's lock (launchers: one line, exit 2)."""


class Stopped(SystemExit):
  """The run stopped early on purpose, after logging why; `code` is the exit status
  (128 + the signal's number for a signal, as a shell reports it; 1 otherwise)."""


class WorkdirLock:
  """An exclusive lock on <workdir>/trainer.lock for one trainer (module docstring).

  Args:
    workdir: the run's directory (created if missing).
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self.file = None

  def acquire(self) -> None:
    """Takes the lock and records this process as its holder; `WorkdirBusy` naming the
    holder when another process has it."""
    if self.file is not None:
      return
    try:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      f = open(self.path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    except OSError as error:  # a workdir that is a file, or not writable
      raise ConfigError(f"--workdir={os.path.dirname(self.path)}: cannot hold the run's "
                        f"lock file: {error.strerror or error}: {error.filename}") from None
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      holder = describe_holder(f.read())
      f.close()
      raise WorkdirBusy(f"--workdir={os.path.dirname(self.path)}: in use by another trainer "
                        f"({holder}; lock {self.path}); stop it or choose another workdir"
                        ) from None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                        "started": datetime.datetime.now().astimezone().isoformat(
                            timespec="seconds")}) + "\n")
    f.flush()
    self.file = f

  def release(self) -> None:
    """Gives the lock up (the file stays: removing it would race a process opening it)."""
    if self.file is not None:
      fcntl.flock(self.file, fcntl.LOCK_UN)
      self.file.close()
      self.file = None


# What a training run writes in its workdir (and `start_over` removes): checkpoints, the
# records, the exported policy, the loggers' files and run ids. The lock file stays.
RUN_OUTPUTS = ("checkpoints", "corrupt_checkpoints", "metrics.jsonl", "rollouts.jsonl",
               "policy", "tensorboard", "wandb_run_id", "mlflow_run_id")


def start_over(workdir: str, lock: WorkdirLock, *, also: tuple[str, ...] = (),
               inputs: dict[str, str] | None = None, log=print) -> list[str]:
  """Removes what a run wrote in `workdir` (RUN_OUTPUTS, plus the names in `also`, e.g.
  the warm start the run trained) so that the next run starts from step 0 (`--overwrite`).
  Only while `lock` (the workdir's) is held: no trainer is writing there. Names only, in
  the workdir itself: a symlink is removed, never followed. `inputs` (config field →
  path it reads): an output that is or holds one of them is refused, before anything is
  removed (a ConfigError naming the field: `model.checkpoint=<workdir>/policy`). Returns
  what it removed."""
  if lock.file is None:
    raise RuntimeError("start_over needs the workdir's lock held (WorkdirLock.acquire)")
  root = os.path.realpath(workdir)
  for name in RUN_OUTPUTS + tuple(also):
    output = os.path.join(root, name)
    for field, path in (inputs or {}).items():
      read = os.path.realpath(path)
      if not os.path.islink(output) and (read == output or read.startswith(output + os.sep)):
        unfit(field, f"{path!r} is in {name!r} of --workdir={workdir}, which --overwrite "
              "would remove; point the field elsewhere or remove the workdir by hand")
  removed = []
  for name in RUN_OUTPUTS + tuple(also):
    path = os.path.join(os.path.abspath(workdir), name)
    if os.path.islink(path) or os.path.isfile(path):
      os.remove(path)
    elif os.path.isdir(path):
      shutil.rmtree(path)
    else:
      continue
    removed.append(name)
  if removed:
    log(f"--overwrite: removed {', '.join(removed)} from {workdir}; starting over")
  return removed


def check_workdir(path: str, where: str = "--workdir") -> None:
  """`path` is a directory, or nothing on its way is a file (so it can be made one)."""
  if not path:
    raise ConfigError(f"{where}: empty; give the run's directory")
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      return
    probe = parent
  if not os.path.isdir(probe):
    inside = "" if probe == os.path.abspath(path) else f" (on the way to {path})"
    raise ConfigError(f"{where}={path}: {probe} is a file, not a directory{inside}")


def describe_holder(text: str) -> str:
  """"pid P on host H since T" from a lock file's contents (what is known of them)."""
  try:
    holder: Any = json.loads(text)
    return (f"pid {holder['pid']} on host {holder['host']} since {holder['started']}")
  except (ValueError, KeyError, TypeError):
    return "holder not recorded yet"


class StopSignals:
  """While entered, SIGINT and SIGTERM set `requested` (the signal's name) instead of
  interrupting; a second SIGINT raises KeyboardInterrupt. Outside the main thread (where
  Python cannot take signals) it does nothing. The previous handlers come back on exit."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.requested: str | None = None
    self.code = 0
    self.previous: dict[int, Any] = {}

  def __enter__(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      for number in self.SIGNALS:
        self.previous[number] = signal.signal(number, self._handle)
    return self

  def _handle(self, number: int, frame) -> None:
    del frame
    if self.requested is not None and number == signal.SIGINT:
      raise KeyboardInterrupt  # asked twice: now
    self.requested = signal.Signals(number).name
    self.code = 128 + number

  def __exit__(self, *exc) -> None:
    for number, handler in self.previous.items():
      signal.signal(number, handler)
    self.previous = {}


def run_to_end(trainer) -> dict[str, Any]:
  """Runs `trainer.train` (training/loop.py) to `train.steps`; returns the summary.

  SIGINT / SIGTERM stop the run where a step's records are complete: it saves that step,
  says so in one line and raises `Stopped` (exit status 128 + the signal); a second
  SIGINT interrupts at once, saving nothing (the last checkpoint is the resume point). A
  fleet whose every server is gone (`SamplerUnavailable`) saves the last complete step
  and raises `Stopped` (status 1). The loggers' runs (W&B, MLflow) finish either way,
  marked failed unless every step was done; the policy is exported after the last step;
  the workdir's lock is released.
  """
  start = time.perf_counter()
  summary: dict[str, Any] = {}
  failed = True  # until the last step is done: the loggers mark their runs failed
  policy = None
  try:
    with StopSignals() as signals:
      trainer.train(summary, start, signals)
    failed = False
  except KeyboardInterrupt:
    trainer.log(f"interrupted at once during step {trainer.recorded_step + 1}: nothing "
                f"saved; resume continues from {last_checkpoint(trainer.checkpointer)}")
    raise
  except SamplerUnavailable as error:
    stop_on_fleet_loss(trainer, error)
  finally:
    try:
      trainer.close(failed=failed, release_lock=False)
      if not failed:  # written while the workdir is still this run's
        policy = trainer.export_policy()
    finally:
      trainer.lock.release()
  summary.update(steps=trainer.step, seconds=time.perf_counter() - start, policy=policy)
  return summary


def stop_if_asked(trainer, signals: StopSignals) -> None:
  """After a step's records (every process agrees): saves the step unless it is saved or
  nothing was trained, says so, and raises `Stopped`."""
  code = parallel.largest_across_processes(signals.code)  # a signal may reach one process
  if not code:
    return
  if trainer.step > 0 and trainer.saved_step != trainer.step:
    trainer.save()
  name = signals.requested or f"signal {code - 128} in another process"
  trainer.log(f"stopped by {name} after step {trainer.step}: "
              f"{last_checkpoint(trainer.checkpointer)}; resume with the same command")
  raise Stopped(code)


def stop_on_fleet_loss(trainer, error: Exception) -> None:
  """Saves the last complete step if a checkpoint of it can be made (the fleet was lost
  while sampling the next one, in a synchronous run: `trainer.step_start`) and is not
  there yet; one line; `Stopped` (status 1)."""
  start = trainer.step_start
  if (start is not None and start[0] == trainer.step == trainer.recorded_step
      and trainer.step > 0 and trainer.saved_step != trainer.step):
    trainer.save(rollout_state=start[1])
  trainer.log(f"every sampling server is gone ({one_line(error)}); "
              f"{last_checkpoint(trainer.checkpointer)}; resume with the same command once "
              "a server is back")
  raise Stopped(1) from None


def last_checkpoint(checkpointer) -> str:
  """Where a resumed run continues from, in words."""
  step = checkpointer.latest_step()
  if step is None:
    return "no checkpoint yet (a resumed run starts over)"
  return f"checkpoint at step {step} in {os.path.join(checkpointer.directory, str(step))}"


def one_line(error: BaseException) -> str:
  """An error's message's first line (its type's name when it has none)."""
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__
