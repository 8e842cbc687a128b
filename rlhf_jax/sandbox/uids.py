"""Sandbox uids unique on the host: allocated under a lock, released after clean-up.

As root, each sandboxed process runs as a uid of its own (RLIMIT_NPROC counts processes
per uid, and the clean-up SIGKILLs every process of the uid). The uid must be unique
among every trainer on the host, whatever its PID namespace or container: a uid is
leased by taking an exclusive `flock` on the file `<LOCK_DIR>/<uid>`, first free from
UID_FIRST. The kernel drops the lock when its holder dies, so a crashed trainer leaks
nothing; trainers that should never share a uid must see one LOCK_DIR (the default,
/run/rlhf_jax_sandbox_uids, is shared by every process of one file system view; give
containers on one host a shared directory through $RLHF_JAX_SANDBOX_UID_DIR).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time

UID_FIRST = 200_000
UID_COUNT = 65_536
DEFAULT_LOCK_DIR = "/run/rlhf_jax_sandbox_uids"
_QUARANTINED: list[int] = []  # lock fds of uids whose processes outlived their clean-up


def lock_dir() -> str:
  """Where the uid lock files live ($RLHF_JAX_SANDBOX_UID_DIR or DEFAULT_LOCK_DIR)."""
  return os.environ.get("RLHF_JAX_SANDBOX_UID_DIR") or DEFAULT_LOCK_DIR


class NoFreeUid(RuntimeError):
  """Every uid of the range is leased, or the lock directory cannot be used."""


@contextlib.contextmanager
def lease():
  """Yields a uid no other holder of LOCK_DIR has; on exit kills every process of that
  uid, then releases it."""
  directory = lock_dir()
  try:
    os.makedirs(directory, mode=0o700, exist_ok=True)
  except OSError as error:
    raise NoFreeUid(f"cannot create the sandbox uid lock directory {directory}: "
                    f"{error.strerror}") from None
  fd, uid = -1, 0
  for uid in range(UID_FIRST, UID_FIRST + UID_COUNT):
    fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      fd = -1
      continue
    # A holder that died (its lock went with it) may have left processes of the uid,
    # e.g. a candidate of the rlimits mode that outlived its trainer: they are killed,
    # and a uid that still has processes is not handed out.
    kill_uid(uid, patience_s=0.5)
    if not processes_of(uid):
      break
    os.close(fd)
    fd = -1
  if fd < 0:
    raise NoFreeUid(f"all {UID_COUNT} sandbox uids from {UID_FIRST} are leased "
                    f"(lock files in {directory}).")
  try:
    yield uid
  finally:
    try:
      kill_uid(uid)
    finally:
      if processes_of(uid):  # unkillable for now: the uid stays leased (quarantined)
        _QUARANTINED.append(fd)
      else:
        os.close(fd)  # releases the lock


def processes_of(uid: int) -> list[int]:
  """The live (not zombie) processes of `uid` that /proc shows."""
  alive = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
        status = f.read()
    except OSError:
      continue
    uid_line = status[status.find("\nUid:"):].split(None, 2)
    if len(uid_line) > 1 and uid_line[1] == str(uid) and "\nState:\tZ" not in status:
      alive.append(int(name))
  return alive


def kill_uid(uid: int, patience_s: float = 5.0) -> None:
  """SIGKILLs every live process of `uid` until none is left (a namespace's teardown is
  asynchronous; the uid is released only when it is unused)."""
  deadline = time.monotonic() + patience_s
  while True:
    alive = processes_of(uid)
    if not alive or time.monotonic() > deadline:
      return
    for pid in alive:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.005)
