"""The sandbox's seccomp layer (sandbox/seccomp_filter.py, docs/sandbox.md).

Two kinds of test:
- the exported BPF program, run here on synthetic system calls by a small classic-BPF
  interpreter: every denied call, every clone namespace flag, clone3, personality values,
  other ABIs, and the calls setpriv and Python need (no sandbox, no privileges needed);
- programs run through the sandbox (`code.run_tests`, like test_sandbox_adversarial.py, and
  only in their own PID namespace: scripts/test.sh, step 3) that make the raw system calls
  with ctypes (x86_64 numbers) and check the errno the filter gives. The arguments are
  chosen so that without the filter the call would succeed or fail otherwise (EFAULT for a
  NULL pointer, EINVAL for bad flags, EBADF for fd -1, ESRCH, ENOSYS), so these tests fail
  when the filter is missing. Calls marked "cap-first" fail with EPERM anyway for the
  sandbox's unprivileged uid (the kernel checks the capability before the arguments): for
  them the sandbox test shows only that they are refused, and the BPF test above shows that
  the filter refuses them.
"""

import errno
import os
import platform
import struct

import pytest

from rlhf_jax.rewards import code
from rlhf_jax.sandbox import jobs as sandbox
from rlhf_jax.sandbox import seccomp_filter
from tests.sandbox.processes import sandbox_processes

adversarial = pytest.mark.adversarial
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64",
                            reason="raw system call numbers and ABIs of x86_64")

# The calls the filter must refuse wherever libseccomp knows them (all of them on x86_64).
REQUIRED = (
    "ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare setns "
    "bpf keyctl add_key request_key perf_event_open init_module finit_module delete_module "
    "kexec_load kexec_file_load reboot swapon swapoff acct quotactl userfaultfd "
    "open_by_handle_at name_to_handle_at iopl ioperm syslog settimeofday clock_settime "
    "clock_adjtime adjtimex sethostname setdomainname io_uring_setup io_uring_enter "
    "io_uring_register fanotify_init lookup_dcookie mount_setattr move_mount open_tree fsopen "
    "fsconfig fsmount fspick").split()
ALLOWED = ("read", "write", "openat", "close", "mmap", "munmap", "brk", "execve", "wait4",
           "exit_group", "futex", "clock_gettime", "getrandom", "setresuid", "setresgid",
           "setgroups", "prctl", "capset", "kill", "pipe2", "socketpair", "prlimit64", "fork",
           "vfork")
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000


def run_bpf(program: bytes, nr: int, args=(), arch: int | None = None) -> int:
  """The seccomp return value of classic-BPF `program` for one system call."""
  seccomp = seccomp_filter._pyseccomp()  # pylint: disable=protected-access
  arch = seccomp.system_arch() if arch is None else arch
  data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
  insns, pc, acc = list(struct.iter_unpack("<HBBI", program)), 0, 0
  while True:
    op, jt, jf, k = insns[pc]
    pc += 1
    if op == 0x20:  # ld [k]
      acc = struct.unpack_from("<I", data, k)[0]
    elif op == 0x54:  # and #k
      acc &= k
    elif op == 0x06:  # ret #k
      return k
    elif op == 0x05:  # ja
      pc += k
    elif op in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
      taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
      pc += jt if taken else jf
    else:
      raise AssertionError(f"unexpected BPF opcode {op:#x}")


def verdict_of(name: str, *args, arch: int | None = None) -> int:
  seccomp = seccomp_filter._pyseccomp()  # pylint: disable=protected-access
  nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
  return run_bpf(seccomp_filter.bpf_program(), nr, args, arch)


def eperm() -> int:
  return seccomp_filter._pyseccomp().ERRNO(errno.EPERM)  # pylint: disable=protected-access


def allow() -> int:
  return seccomp_filter._pyseccomp().ALLOW  # pylint: disable=protected-access


@x86_64
def test_every_required_call_is_known_on_x86_64():
  assert set(REQUIRED) <= set(seccomp_filter.DENIED)
  assert not set(REQUIRED) & set(seccomp_filter.skipped_syscalls())


def test_the_filter_refuses_every_denied_call_and_allows_the_rest():
  denied = set(seccomp_filter.DENIED) - set(seccomp_filter.skipped_syscalls())
  assert {name: hex(verdict_of(name)) for name in denied} == {
      name: hex(eperm()) for name in denied}
  assert {name: hex(verdict_of(name)) for name in ALLOWED} == {
      name: hex(allow()) for name in ALLOWED}


def test_clone_with_a_namespace_flag_is_refused_and_clone3_says_enosys():
  thread = 0x3D0F00  # glibc's pthread_create flags (CLONE_VM|CLONE_FS|...|CLONE_THREAD)
  for flags in (thread, 0x11,  # SIGCHLD: fork
                0x01200011):  # fork with CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID
    assert verdict_of("clone", flags) == allow(), hex(flags)
  for name, flag in seccomp_filter.NAMESPACE_FLAGS.items():
    for flags in (flag, flag | 0x11, flag | thread, flag | (0xFFFF << 32)):
      assert verdict_of("clone", flags) == eperm(), (name, hex(flags))
  seccomp = seccomp_filter._pyseccomp()  # pylint: disable=protected-access
  assert verdict_of("clone3", 0, 88) == seccomp.ERRNO(errno.ENOSYS)


def test_personality_may_only_be_queried_or_reset():
  for persona in seccomp_filter.PERSONALITY_ALLOWED + (1 << 32,):  # the kernel reads 32 bits
    assert verdict_of("personality", persona) == allow(), hex(persona)
  for persona in (0x0040000, 0x0400000, 0x8, 0xFFFFFFFE, 0x7FFFFFFF, 0x80000000,
                  (1 << 32) | 0x0040000):
    assert verdict_of("personality", persona) == eperm(), hex(persona)


@x86_64
def test_other_abis_kill_the_process():
  kill = seccomp_filter._pyseccomp().KILL_PROCESS  # pylint: disable=protected-access
  assert seccomp_filter.BAD_ARCH_ACTION == "KILL_PROCESS"
  program = seccomp_filter.bpf_program()
  assert run_bpf(program, 20, arch=AUDIT_ARCH_I386) == kill  # int 0x80: i386 getpid
  assert run_bpf(program, X32_SYSCALL_BIT | 39) == kill  # x32 getpid
  assert run_bpf(program, 39) == allow()  # getpid


@pytest.mark.parametrize("pipe_max", [4096, 0])  # a pipe, then a temporary file
def test_program_fd_is_a_read_only_copy_of_the_program(pipe_max):
  fd = seccomp_filter.program_fd(pipe_max)
  try:
    assert os.read(fd, 1 << 20) == seccomp_filter.bpf_program()
    with pytest.raises(OSError):
      os.write(fd, b"x")
  finally:
    os.close(fd)


def test_no_libseccomp_is_an_error_not_a_sandbox_without_a_filter(monkeypatch):
  def missing():
    raise seccomp_filter.SeccompUnavailable("pip install pyseccomp")

  seccomp_filter._compiled.cache_clear()  # pylint: disable=protected-access
  monkeypatch.setattr(seccomp_filter, "_pyseccomp", missing)
  try:
    with pytest.raises(sandbox.SandboxUnavailable, match="pyseccomp"):
      sandbox.run_job({"mode": "tests", "solution": "", "tests": "assert True"},
                      sandbox.Limits(isolation="namespaces"))
  finally:
    seccomp_filter._compiled.cache_clear()  # pylint: disable=protected-access


# (label, x86_64 number, arguments, errno the sandboxed call must give; "OK" = no error).
# "pid" stands for the caller's pid, "/" for a pointer to the string "/". Comments: what
# the call gives without the filter.
FAMILIES = {
    "other processes": [
        ("ptrace", 101, (2, "pid", 0, 0), "EPERM"),  # PEEKDATA of an untraced pid: ESRCH
        ("process_vm_readv", 310, ("pid", 0, 0, 0, 0, 0), "EPERM"),  # OK
        ("process_vm_writev", 311, ("pid", 0, 0, 0, 0, 0), "EPERM"),  # OK
        ("pidfd_getfd", 438, (-1, 0, 0), "EPERM"),  # EBADF
    ],
    "mounts": [
        ("mount", 165, (0, 0, 0, 0, 0), "EPERM"),  # EFAULT
        ("umount2", 166, (0, 0xFFFFFFFF), "EPERM"),  # EINVAL
        ("chroot", 161, (0,), "EPERM"),  # EFAULT
        ("pivot_root", 155, (0, 0), "EPERM"),  # cap-first
        ("mount_setattr", 442, (-1, 0, 0xFFFFFFFF, 0, 0), "EPERM"),  # EINVAL
        ("open_tree", 428, (-100, "/", 0), "EPERM"),  # OK: an O_PATH fd of /
        ("fsconfig", 431, (-1, 0xFFFF, 0, 0, 0), "EPERM"),  # EINVAL
        ("move_mount", 429, (-1, 0, -1, 0, 0xFFFFFFFF), "EPERM"),  # cap-first
        ("fsopen", 430, (0, 0), "EPERM"),  # cap-first
        ("fsmount", 432, (-1, 0, 0), "EPERM"),  # cap-first
        ("fspick", 433, (-1, 0, 0), "EPERM"),  # cap-first
    ],
    "namespaces": [
        ("unshare", 272, (0,), "EPERM"),  # OK: unshare(0) does nothing
        ("setns", 308, (-1, 0), "EPERM"),  # EBADF
        # CLONE_THREAD without CLONE_SIGHAND makes each clone EINVAL without the filter
        # (and creates nothing); the filter refuses it first for its namespace flag.
        *[(f"clone {name}", 56, (flag | 0x10000, 0, 0, 0, 0), "EPERM")
          for name, flag in seccomp_filter.NAMESPACE_FLAGS.items()],
        ("clone without namespace flags", 56, (0x10000, 0, 0, 0, 0), "EINVAL"),  # control
        ("clone3", 435, (0, 0), "ENOSYS"),  # EINVAL
    ],
    "kernel interfaces": [
        ("bpf", 321, (0xFFFF, 0, 0), "EPERM"),  # EINVAL
        ("perf_event_open", 298, (0, 0, -1, -1, 0), "EPERM"),  # EFAULT
        ("userfaultfd", 323, (1,), "EPERM"),  # UFFD_USER_MODE_ONLY: OK
        ("io_uring_setup", 425, (1, 0), "EPERM"),  # EFAULT
        ("io_uring_enter", 426, (-1, 0, 0, 0, 0, 0), "EPERM"),  # EBADF
        ("io_uring_register", 427, (-1, 0, 0, 0), "EPERM"),  # EINVAL
        ("keyctl", 250, (0xFFFF, 0, 0, 0, 0), "EPERM"),  # EOPNOTSUPP (ENOTSUP)
        ("add_key", 248, (0, 0, 0, 0, 0), "EPERM"),  # EFAULT
        ("request_key", 249, (0, 0, 0, 0), "EPERM"),  # EFAULT
        ("fanotify_init", 300, (0x200, 0), "EPERM"),  # FAN_REPORT_FID: OK
        ("lookup_dcookie", 212, (0, 0, 0), "EPERM"),  # ENOSYS (gone since Linux 6.8)
        ("open_by_handle_at", 304, (-1, 0, 0), "EPERM"),  # EFAULT
        ("name_to_handle_at", 303, (-1, 0, 0, 0, 0), "EPERM"),  # EFAULT
    ],
    "the machine": [
        ("swapon", 167, (0, 0xFFFFFFFF), "EPERM"),  # EINVAL
        ("quotactl", 179, (0xFF, 0, 0, 0), "EPERM"),  # EINVAL (no quota type 255)
        # ENOSYS where the kernel is built without them, else EINVAL (iopl, ioperm) or
        # cap-first (modules, kexec)
        ("iopl", 172, (4,), "EPERM"),
        ("ioperm", 173, (0, 0x10001, 0), "EPERM"),
        ("init_module", 175, (0, 0, 0), "EPERM"),
        ("finit_module", 313, (-1, 0, 0), "EPERM"),
        ("delete_module", 176, (0, 0), "EPERM"),
        ("kexec_load", 246, (0, 0, 0, 0), "EPERM"),
        ("kexec_file_load", 320, (-1, -1, 0, 0, 0), "EPERM"),
        ("reboot", 169, (0, 0, 0, 0), "EPERM"),  # cap-first (and a bad magic)
        ("swapoff", 168, (0,), "EPERM"),  # cap-first
        ("acct", 163, (0,), "EPERM"),  # cap-first
        ("syslog", 103, (10, 0, 0), "EPERM"),  # the buffer size; cap-first if dmesg_restrict
    ],
    "clocks and names": [
        ("settimeofday", 164, (1, 0), "EPERM"),  # EFAULT
        ("clock_settime", 227, (0, 0), "EPERM"),  # EFAULT
        ("clock_adjtime", 305, (0, 0), "EPERM"),  # EFAULT
        ("adjtimex", 159, (0,), "EPERM"),  # EFAULT
        ("sethostname", 170, (0, 0), "EPERM"),  # cap-first
        ("setdomainname", 171, (0, 0), "EPERM"),  # cap-first
    ],
    "personality": [
        ("ADDR_NO_RANDOMIZE", 135, (0x0040000,), "EPERM"),  # OK
        ("READ_IMPLIES_EXEC", 135, (0x0400000,), "EPERM"),  # OK
        ("PER_LINUX32", 135, (0x8,), "EPERM"),  # OK
        ("high bits ignored", 135, ((1 << 32) | 0x0040000,), "EPERM"),  # OK
        ("query", 135, (0xFFFFFFFF,), "OK"),  # control
    ],
}

PROBE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
root = ctypes.create_string_buffer(b"/")
values = {"pid": os.getpid(), "/": ctypes.addressof(root)}

def call(nr, args):
  args = [ctypes.c_ulong(values.get(a, a) if isinstance(a, str) else a) for a in args]
  ctypes.set_errno(0)
  result = libc.syscall(ctypes.c_long(nr), *args)
  return "OK" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")

wrong = {label: got for label, nr, args, want in CALLS if (got := call(nr, args)) != want}
"""


@adversarial
@x86_64
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_sandbox_refuses_the_family(family):
  verdict = code.run_tests(f"CALLS = {FAMILIES[family]!r}\n{PROBE}", "assert not wrong, wrong",
                           timeout_s=5.0)
  assert verdict.passed and verdict.tests_run == 1, verdict
  assert sandbox_processes() == []


@adversarial
@x86_64
def test_unshare_and_ptrace_through_libc_and_the_unshare_tool_fail():
  solution = """
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
for flag in (0x10000000, 0x00020000, 0x40000000):  # CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET
  seen[hex(flag)] = (libc.unshare(flag), ctypes.get_errno())
seen["unshare --user"] = subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                                        capture_output=True).returncode
seen["ptrace"] = (libc.ptrace(0, 0, 0, 0), ctypes.get_errno())  # PTRACE_TRACEME
"""
  tests = ("assert seen.pop('unshare --user') != 0\n"
           "assert set(seen.values()) == {(-1, 1)}, seen")  # (-1, EPERM)
  verdict = code.run_tests(solution, tests, timeout_s=5.0)
  assert verdict.passed and verdict.tests_run == 2, verdict


@adversarial
@x86_64
@pytest.mark.parametrize("call", [
    "libc.syscall(ctypes.c_long(0x40000000 | 39))",  # x32 getpid; without the filter: ENOSYS
    # i386 getpid by int 0x80 from a page of machine code; without the filter: the pid
    "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()",
], ids=["x32", "int 0x80"])
def test_system_calls_of_another_abi_kill_the_job(call):
  solution = ("import ctypes, mmap\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | "
              "mmap.PROT_EXEC)\npage.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n"
              f"print({call})")
  verdict = code.run_tests(solution, "assert True", timeout_s=5.0)
  assert verdict.reason == "killed by SIGSYS", verdict
  assert sandbox_processes() == []


@adversarial
def test_ordinary_programs_still_work_under_the_filter():
  solution = """
import ctypes, os, subprocess, sys, threading, time
child = os.fork()
if child == 0:
  os._exit(7)
forked = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
# sys.executable may sit under a directory the sandbox's uid cannot search (/root/...)
python = next(p for p in (sys.executable, "/usr/bin/python3") if os.access(p, os.X_OK))
ran = subprocess.run([python, "-c", "print(6 * 7)"], capture_output=True, text=True)
results = []
threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]
for t in threads:
  t.start()
for t in threads:
  t.join()
with open("/tmp/data.txt", "w") as f:
  f.write("hello")
text = open("/tmp/data.txt").read()
os.remove("/tmp/data.txt")
start = time.monotonic()
time.sleep(0.01)
slept, now = time.monotonic() - start, time.time()
libc = ctypes.CDLL(None)
persona = libc.personality(0xFFFFFFFF)
printed = ran.stdout
random_bytes = len(os.urandom(8))
"""
  # The tests run in the harness: they see the solution's plain-data values (not its
  # objects or modules).
  tests = ("assert forked == 7\nassert printed == '42\\n', printed\n"
           "assert sorted(results) == [0, 1, 2, 3]\nassert text == 'hello'\n"
           "assert slept >= 0.01 and now > 1.7e9\n"
           "assert persona >= 0\nassert random_bytes == 8")
  verdict = code.run_tests(solution, tests, timeout_s=10.0)
  assert verdict.passed and verdict.tests_run == 7, verdict
  assert sandbox_processes() == []
