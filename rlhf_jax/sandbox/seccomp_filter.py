"""The seccomp filter of the code sandbox's "namespaces" mode (docs/sandbox.md).

bubblewrap reads the program from a file descriptor (`--seccomp FD`) and installs it just
before it execs the sandboxed command, so setpriv, the runner and every child inherit it
and none can remove it (filters only stack up). Default action: allow. Refused:

- with EPERM, the `DENIED` system calls: families a test program never needs and that
  widen the kernel's attack surface (debugging other processes, mounts and namespaces,
  eBPF, perf, keyrings, io_uring, userfaultfd, kernel modules, kexec, reboot, swap,
  accounting, quotas, file handles, port I/O, the kernel log, the clocks, host names);
- with EPERM, `clone` with any `CLONE_NEW*` namespace flag (threads and fork still work);
- with ENOSYS, `clone3`: its flags sit in a struct a filter cannot read, and glibc falls
  back to `clone` (which the filter can inspect) when clone3 says ENOSYS;
- with EPERM, `personality` with anything but 0 (PER_LINUX) or 0xffffffff (the query):
  no ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC or other execution domain;
- a system call of another ABI than the native one (x32 numbers or `int 0x80` on x86_64)
  kills the whole process with SIGSYS (`BAD_ARCH_ACTION`): nothing legitimate uses them.

Built with libseccomp through `pyseccomp` (a ctypes binding of the system's
libseccomp.so.2), once per process, and exported as classic BPF.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import tempfile

DENIED = (
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    # mounts, the root, namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "move_mount", "open_tree", "open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick",
    # kernel attack surface that a test program does not need
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "fanotify_init",
    "lookup_dcookie", "open_by_handle_at", "name_to_handle_at", "uselib",
    # the machine itself
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "iopl", "ioperm", "syslog", "vhangup", "nfsservctl", "_sysctl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname",
)
# clone(2)'s namespace flags (CLONE_NEWTIME, 0x80, is an exit-signal bit for clone(2)
# and is reachable only through unshare and clone3, both refused).
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
                   "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000,
                   "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
# personality(2) values that stay allowed: PER_LINUX and the query.
PERSONALITY_ALLOWED = (0, 0xFFFFFFFF)
BAD_ARCH_ACTION = "KILL_PROCESS"


class SeccompUnavailable(RuntimeError):
  """libseccomp (or its binding, pyseccomp) is missing or cannot build the filter."""


def _pyseccomp():
  """The pyseccomp module, or SeccompUnavailable saying what to install."""
  try:
    import pyseccomp  # pylint: disable=import-outside-toplevel
  except (ImportError, OSError, RuntimeError) as error:
    raise SeccompUnavailable(
        "the code sandbox's seccomp filter needs libseccomp and its Python binding: pip "
        "install pyseccomp (a core dependency on Linux) and the system's libseccomp.so.2 "
        f"(Debian/Ubuntu: libseccomp2; Fedora: libseccomp) ({error}).") from None
  return pyseccomp


def _clone_flags_arg(seccomp) -> int:
  """Which argument of clone(2) holds the flags (the second on s390, else the first)."""
  return 1 if seccomp.system_arch() in (seccomp.Arch.S390, seccomp.Arch.S390X) else 0


def _add(seccomp, syscall_filter, action: int, name: str) -> bool:
  """Refuses `name` with `action`; False if libseccomp does not know it on this arch."""
  number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
  if number < 0:  # unknown name (-1) or a pseudo-number of a call this arch lacks
    return False
  try:
    syscall_filter.add_rule(action, number)
  except OSError:
    return False
  return True


def build_filter() -> tuple[object, tuple[str, ...]]:
  """The libseccomp filter of the module docstring, for the native architecture only.

  Returns:
    (filter, skipped): a `pyseccomp.SyscallFilter`, and the names of `DENIED` that
    libseccomp does not know on this architecture (left out of the filter).

  Raises:
    SeccompUnavailable: pyseccomp or libseccomp is missing.
    OSError: libseccomp refused an attribute or a clone, clone3 or personality rule
      (these are never skipped: without them the filter would let namespaces through).
  """
  seccomp = _pyseccomp()
  eperm = seccomp.ERRNO(errno.EPERM)
  syscall_filter = seccomp.SyscallFilter(seccomp.ALLOW)
  syscall_filter.set_attr(seccomp.Attr.ACT_BADARCH, getattr(seccomp, BAD_ARCH_ACTION))
  skipped = tuple(name for name in DENIED if not _add(seccomp, syscall_filter, eperm, name))
  flags_arg = _clone_flags_arg(seccomp)
  for flag in NAMESPACE_FLAGS.values():  # one rule per flag: any one of them is refused
    syscall_filter.add_rule(eperm, "clone", seccomp.Arg(flags_arg, seccomp.MASKED_EQ, flag,
                                                        flag))
  syscall_filter.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
  # personality takes an unsigned int: a value of its low 32 bits other than all-zeros and
  # all-ones has a set bit followed (cyclically) by a clear one, so these 32 masked
  # comparisons refuse exactly the values outside PERSONALITY_ALLOWED.
  for bit in range(32):
    mask = (1 << bit) | (1 << ((bit + 1) % 32))
    syscall_filter.add_rule(eperm, "personality",
                            seccomp.Arg(0, seccomp.MASKED_EQ, mask, 1 << bit))
  return syscall_filter, skipped


@functools.cache
def _compiled() -> tuple[bytes, tuple[str, ...]]:
  """(the BPF program, the skipped names), built once per process."""
  try:
    syscall_filter, skipped = build_filter()
    with tempfile.TemporaryFile() as exported:
      syscall_filter.export_bpf(exported)
      exported.seek(0)
      program = exported.read()
  except OSError as error:  # libseccomp refused a rule, the attribute or the export
    message = f"libseccomp could not build the sandbox's filter: {error}"
    raise SeccompUnavailable(message) from None
  return program, skipped


def bpf_program() -> bytes:
  """The filter as a classic BPF program (struct sock_filter array), built once.

  Exported rather than loaded here: bubblewrap installs it in the sandboxed process only.

  Raises:
    SeccompUnavailable: pyseccomp or libseccomp is missing, or cannot build the filter.
  """
  return _compiled()[0]


def skipped_syscalls() -> tuple[str, ...]:
  """Names of `DENIED` that libseccomp does not know on this architecture (not filtered).

  They are told apart so that tests can insist the calls that matter are all filtered.

  Raises:
    SeccompUnavailable: pyseccomp or libseccomp is missing, or cannot build the filter.
  """
  return _compiled()[1]


def program_fd(pipe_max: int = select.PIPE_BUF) -> int:
  """A read-only file descriptor positioned at the start of `bpf_program()`, for
  bubblewrap's `--seccomp FD` (pass it with `pass_fds`, close it after the start).

  A pipe whose write end is already closed when the program fits in `pipe_max` bytes
  (PIPE_BUF: a pipe holds at least that much, so the write cannot block); otherwise a
  deleted temporary file opened read-only.

  Raises:
    SeccompUnavailable: pyseccomp or libseccomp is missing, or cannot build the filter.
  """
  program = bpf_program()
  if len(program) <= pipe_max:
    read_end, write_end = os.pipe()
    try:
      os.write(write_end, program)
    except BaseException:
      os.close(read_end)
      raise
    finally:
      os.close(write_end)
    return read_end
  with tempfile.NamedTemporaryFile(prefix="rlhf_jax_seccomp_") as file:
    file.write(program)
    file.flush()
    return os.open(file.name, os.O_RDONLY | os.O_CLOEXEC)
