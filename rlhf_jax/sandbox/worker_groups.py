"""What a worker running user code may hold: its memory and the processes it starts.

Environments and reward functions are user code (a tool that runs a shell, a simulator that
leaks, a scorer that starts a helper process). Each worker process of a `GroupPool`
(sandbox/workers.py) leads its own process group, so every process the user code starts
(that does not leave the group on purpose) is in it:

  - killing a worker (a timeout, a restart, the runner's close) kills its whole group;
  - a worker kills the rest of its group when it exits, and its watchdog thread kills the
    group when the trainer is gone (a SIGKILLed trainer leaves no one else to do it);
  - the watchdog ends the worker with `MEMORY_EXIT_CODE` when the group's resident memory
    passes its limit (`env.worker_memory_mb`, `reward.worker_memory_mb`; the pool then
    replaces it, and the call it was running fails with reason "memory");
  - `end_call` kills the rest of the group after a call, for user code that must not keep
    processes between calls (reward functions).

Linux only (/proc); elsewhere memory is not watched.
"""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import threading
import time

MEMORY_EXIT_CODE = 75  # a worker that ended itself for passing its memory limit
WATCH_INTERVAL_S = 0.2
GROUP_EVERY = 5  # ticks between scans of the whole group's memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def group_members(pgid: int) -> list[tuple[int, int]]:
  """(pid, resident bytes) of every live process in process group `pgid` (from /proc;
  [] where there is none)."""
  out = []
  try:
    names = os.listdir("/proc")
  except OSError:
    return out
  for name in names:
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
      continue  # it ended while we looked
    # After "pid (comm)": state ppid pgrp ... rss is the 22nd (man 5 proc).
    if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
      out.append((int(name), int(fields[21]) * _PAGE))
  return out


def kill_group(pgid: int) -> None:
  """SIGKILLs process group `pgid` (a worker and what its environment started); nothing
  when the group is gone."""
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def end_call() -> None:
  """Worker side, after a call: SIGKILLs every other process of the worker's group (what
  the call started and left running)."""
  _kill_others(os.getpid())


def _kill_others(pgid: int) -> None:
  me = os.getpid()
  for pid, _ in group_members(pgid):
    if pid != me:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def _resident(pid: int) -> int:
  """`pid`'s resident bytes (0 once it is gone)."""
  try:
    with open(f"/proc/{pid}/statm", "rb") as f:
      return int(f.read().split()[1]) * _PAGE
  except (OSError, IndexError, ValueError):
    return 0


def _watch(memory_mb: int, parent: int) -> None:
  """Worker thread: see the module docstring. Its own memory is read every tick; the
  group's, a scan of /proc, every `GROUP_EVERY` ticks (cheap on a busy host)."""
  me, limit = os.getpid(), memory_mb * 2**20
  tick = 0
  while True:
    time.sleep(WATCH_INTERVAL_S)
    tick += 1
    if os.getppid() != parent:  # the trainer is gone: take the group with us
      kill_group(me)
    if not limit:
      continue
    used = (sum(rss for _, rss in group_members(me)) if tick % GROUP_EVERY == 0
            else _resident(me))
    if used > limit:
      _kill_others(me)
      os._exit(MEMORY_EXIT_CODE)  # pylint: disable=protected-access


def start_worker(memory_mb: int, parent: int) -> None:
  """Worker start-up (a `KillablePool` initializer): lead a new process group and start
  the watchdog. `memory_mb`: the group's resident limit (0: none); `parent`: the trainer's
  pid."""
  os.setpgid(0, 0)
  # A worker whose trainer is gone sees its pipe close and returns: on the way out it
  # takes its group along (multiprocessing runs finalizers at a worker's exit).
  multiprocessing.util.Finalize(None, _kill_others, args=(os.getpid(),), exitpriority=100)
  threading.Thread(target=_watch, args=(memory_mb, parent), daemon=True,
                   name="worker-watchdog").start()
