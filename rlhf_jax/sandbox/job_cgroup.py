"""A cgroup per sandboxed process: its memory and process count bounded as a whole.

`RLIMIT_AS` bounds one process; a job that forks has several. Where a cgroup can be made
(as root, or in a delegated subtree), each sandboxed process and everything it forks
runs in a cgroup of its own with a memory limit (tmpfs pages and kernel memory such as
inodes included, no swap) and a process limit, and is SIGKILLed as a whole at the end.
cgroup v2 is used where its memory and pids controllers are available, else cgroup v1's
memory and pids hierarchies. Where neither can be made, `probe()` says why and the
memory bound stays per process (docs/sandbox.md).

Placement: under a directory `rlhf_jax_sandbox` beside the trainer's own cgroup (v2:
the trainer's cgroup holds processes, so its children cannot take controllers) or
inside it (v1), or under $RLHF_JAX_SANDBOX_CGROUP (a delegated v2 directory).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time

_BASE = "rlhf_jax_sandbox"


def _mounts() -> dict:
  """{"cgroup2": (mount point, root)} and {"memory"/"pids": (mount point, root)} (v1)."""
  found = {}
  with open("/proc/self/mountinfo", encoding="utf-8") as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, (fstype, _, options) = left.split(), right.split()[:3]
      if fstype == "cgroup2":
        found.setdefault("cgroup2", (fields[4], fields[3]))
      elif fstype == "cgroup":
        for controller in ("memory", "pids"):
          if controller in options.split(","):
            found.setdefault(controller, (fields[4], fields[3]))
  return found


def _own_paths() -> dict:
  """The trainer's cgroup per hierarchy: {"": v2 path, "memory": ..., "pids": ...}."""
  paths = {}
  with open("/proc/self/cgroup", encoding="utf-8") as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      for controller in controllers.split(",") or [""]:
        paths[controller] = path
  return paths


def _join(mount: tuple[str, str], path: str) -> str:
  point, root = mount
  relative = path[len(root):] if path.startswith(root) and root != "/" else path
  return os.path.join(point, relative.lstrip("/"))


def _write(path: str, value: str) -> None:
  with open(path, "w", encoding="ascii") as f:
    f.write(value)


def _read(path: str) -> str:
  with open(path, encoding="ascii") as f:
    return f.read()


def _try_child(base: str) -> None:
  """OSError unless this process may make job cgroups under `base` (it may exist, made
  by another user)."""
  probe_dir = os.path.join(base, f"probe-{secrets.token_hex(4)}")
  os.mkdir(probe_dir)
  os.rmdir(probe_dir)


def _v2_base(mounts: dict, own: dict) -> tuple[str | None, str]:
  """The v2 directory whose children get the memory and pids controllers, or (None, why)."""
  delegated = os.environ.get("RLHF_JAX_SANDBOX_CGROUP")
  if delegated:
    base = delegated
  else:
    own_dir = _join(mounts["cgroup2"], own[""]).rstrip("/")
    # Not inside the trainer's own cgroup: a cgroup with processes cannot pass
    # controllers to its children (v2's no-internal-processes rule).
    base = os.path.join(own_dir if own[""] == "/" else os.path.dirname(own_dir), _BASE)
  try:
    os.makedirs(base, exist_ok=True)
    if not {"memory", "pids"} <= set(_read(os.path.join(base, "cgroup.controllers")).split()):
      if not delegated:
        os.rmdir(base)
      return None, (f"cgroup v2: {os.path.dirname(base)} does not pass the memory and pids "
                    "controllers on (cgroup.subtree_control)")
    _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
    _try_child(base)
  except OSError as error:
    return None, f"cgroup v2: {error.filename}: {error.strerror}"
  return base, ""


@functools.cache
def probe() -> tuple[dict | None, str]:
  """({"v2": base} or {"memory": base, "pids": base}, "") where job cgroups can be made,
  else (None, why not). Creates the base directories."""
  try:
    mounts, own = _mounts(), _own_paths()
  except OSError as error:
    return None, f"cannot read the cgroups ({error.filename}: {error.strerror})"
  why = "no cgroup v2 with the memory and pids controllers, nor cgroup v1 ones"
  if "cgroup2" in mounts and "" in own:
    base, why = _v2_base(mounts, own)
    if base:
      return {"v2": base}, ""
  if "memory" in mounts and "pids" in mounts:
    bases = {c: os.path.join(_join(mounts[c], own.get(c, "/")), _BASE)
             for c in ("memory", "pids")}
    try:
      for base in bases.values():
        os.makedirs(base, exist_ok=True)
        _try_child(base)
    except OSError as error:
      return None, f"cannot create a cgroup ({error.filename}: {error.strerror})"
    return bases, ""
  return None, why


class JobCgroup:
  """One sandboxed process's cgroup(s): `memory_bytes` and `pids` over all its processes.

  `procs_files` are the files its first process writes its pid into (the launcher's
  shell does, before it execs the sandbox). `close()` kills everything left and removes
  the directories.
  """

  def __init__(self, bases: dict, memory_bytes: int, pids: int):
    name = f"job-{secrets.token_hex(8)}"  # not the pid: PID namespaces repeat pids
    self.dirs = {kind: os.path.join(base, name) for kind, base in bases.items()}
    for directory in self.dirs.values():
      os.mkdir(directory)
    try:
      if "v2" in self.dirs:
        d = self.dirs["v2"]
        _write(os.path.join(d, "memory.max"), str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: no swap
          _write(os.path.join(d, "memory.swap.max"), "0")
        _write(os.path.join(d, "pids.max"), str(pids))
      else:
        d = self.dirs["memory"]
        _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):
          _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        _write(os.path.join(self.dirs["pids"], "pids.max"), str(pids))
    except OSError:
      self.close()
      raise
    self.procs_files = [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

  def oom_kills(self) -> int:
    """How many of the job's processes the kernel killed at the memory limit."""
    path = (os.path.join(self.dirs["v2"], "memory.events") if "v2" in self.dirs
            else os.path.join(self.dirs["memory"], "memory.oom_control"))
    for line in _read(path).splitlines():
      key, _, value = line.partition(" ")
      if key == "oom_kill":
        return int(value)
    return 0

  def peak_bytes(self) -> int | None:
    """The job's peak memory (None where the kernel does not record it)."""
    path = (os.path.join(self.dirs["v2"], "memory.peak") if "v2" in self.dirs
            else os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes"))
    try:
      return int(_read(path))
    except (OSError, ValueError):
      return None

  def close(self, patience_s: float = 5.0) -> None:
    """SIGKILLs every process left in the cgroup(s), then removes them."""
    deadline = time.monotonic() + patience_s
    for directory in self.dirs.values():
      if not os.path.isdir(directory):
        continue
      with contextlib.suppress(OSError):
        _write(os.path.join(directory, "cgroup.kill"), "1")  # v2 (kernel >= 5.14)
      while True:
        with contextlib.suppress(OSError):
          pids = _read(os.path.join(directory, "cgroup.procs")).split()
          for pid in pids:
            with contextlib.suppress(ProcessLookupError):
              os.kill(int(pid), signal.SIGKILL)
        try:
          os.rmdir(directory)
          break
        except FileNotFoundError:
          break
        except OSError:
          if time.monotonic() > deadline:
            break
          time.sleep(0.005)
