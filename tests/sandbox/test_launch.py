"""The command line of one sandboxed process (sandbox/launch.py), built for each isolation
and privilege as the module docstring draws it (nothing is run here; the programs in a real
sandbox: test_jobs.py, test_sandbox_adversarial.py)."""

from __future__ import annotations

import pytest

from rlhf_jax.sandbox import launch
from rlhf_jax.sandbox.jobs import Limits

BWRAP = "/opt/fake/bwrap"


@pytest.fixture(autouse=True)
def fake_tools(monkeypatch):
  """bwrap and util-linux's tools by name: the argv is inspected, never run."""
  monkeypatch.setattr(launch, "_bwrap", lambda: BWRAP)
  monkeypatch.setattr(launch, "_tool", lambda name: f"/usr/bin/{name}")
  monkeypatch.setattr(launch, "_check_runnable_by_others", lambda path, uid: None)


def python_tail(argv, report_fd=9):
  """The interpreter's part of `argv`: python -I -S -c <source> <fd> (its last items)."""
  start = argv.index(launch.interpreter())
  assert argv[start + 1:start + 4] == ["-I", "-S", "-c"]
  assert argv[start + 5] == str(report_fd)
  return argv[start:], argv[start + 4]


def test_the_program_is_the_wire_then_the_program_in_one_text():
  runner, harness = launch.source("runner"), launch.source("harness")
  # wire.py's functions come first, then the program's (one `-c` text, no import of ours).
  assert runner.index("def encode") < runner.index("def _run_io")
  assert harness.index("def encode") < harness.index("def _run_calls")
  assert "from __future__ import annotations" not in runner + harness
  compile(runner, "runner", "exec")
  compile(harness, "harness", "exec")


def test_rlimits_guards_the_runner_and_drops_to_the_uid_as_root():
  limits = Limits(isolation="rlimits")
  argv = launch.command("runner", 9, limits, uid=None, seccomp=None, workdir="/w",
                        cgroup_procs=[])
  tail, code = python_tail(argv)
  assert argv == tail and code.startswith(launch._AUDIT_GUARD)  # pylint: disable=protected-access
  harness = launch.command("harness", 9, limits, uid=None, seccomp=None, workdir="/w",
                           cgroup_procs=[])
  assert harness[-1] == "undumpable" and "addaudithook" not in harness[4]
  as_root = launch.command("runner", 9, limits, uid=200_001, seccomp=None, workdir="/w",
                           cgroup_procs=["/cg/a/cgroup.procs"])
  assert as_root[:6] == ["/bin/sh", "-c", launch._JOIN_CGROUP, "sh",  # pylint: disable=protected-access
                         "/cg/a/cgroup.procs", "--"]
  assert as_root[6:12] == ["/usr/bin/setpriv", "--reuid=200001", "--regid=200001",
                           "--clear-groups", "--no-new-privs", "--"]


def test_namespaces_need_the_seccomp_fd():
  with pytest.raises(ValueError, match="needs the seccomp program's fd"):
    launch.command("runner", 9, Limits(), uid=None, seccomp=None, workdir="/w", cgroup_procs=[])


def test_namespaces_without_root_unshare_everything_in_a_user_namespace():
  argv = launch.command("runner", 9, Limits(disk_mb=32), uid=None, seccomp=5, workdir="/w",
                        cgroup_procs=[])
  assert argv[:3] == [BWRAP, "--seccomp", "5"]
  for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-user",
               "--die-with-parent", "--clearenv"):
    assert flag in argv
  tmp = argv.index("--tmpfs")
  assert argv[tmp - 4:tmp + 2] == ["--perms", "1777", "--size", str(32 << 20), "--tmpfs", "/tmp"]
  assert "/usr/bin/setpriv" not in argv and "/usr/bin/unshare" not in argv
  tail, code = python_tail(argv)
  assert argv[argv.index(tail[0]) - 1] == "--" and not code.startswith(launch._AUDIT_GUARD)  # pylint: disable=protected-access


def test_namespaces_as_root_mount_a_capped_tmp_and_drop_to_the_uid():
  argv = launch.command("runner", 9, Limits(disk_mb=32, max_files=100), uid=200_002, seccomp=5,
                        workdir="/jobs/7", cgroup_procs=[])
  assert argv[:5] == ["/usr/bin/unshare", "--mount", "--propagation", "private", "--"]
  assert f"size={32 << 20},nr_inodes=100,mode=1777" in argv and "/jobs/7" in argv
  bind = argv.index("--bind")
  assert argv[bind:bind + 3] == ["--bind", "/jobs/7", "/tmp"] and "--unshare-user" not in argv
  drop = argv.index("/usr/bin/setpriv")
  assert "--inh-caps=-all" in argv[drop:] and "--bounding-set=-all" in argv[drop:]
  assert drop < argv.index(launch.interpreter())
