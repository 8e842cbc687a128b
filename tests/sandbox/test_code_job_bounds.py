"""A code job bounded as a whole (docs/sandbox.md): its memory over all its processes
(a cgroup), the files of its /tmp (tmpfs nr_inodes) and a uid no other trainer has.

Hostile programs: runs only in its own PID namespace, like test_sandbox_adversarial.py
(scripts/test.sh, step 3).
"""

import errno
import os
import subprocess
import sys
import time

import pytest

from rlhf_jax.rewards import code
from rlhf_jax.sandbox import jobs as sandbox
from tests.sandbox.processes import sandbox_processes

pytestmark = pytest.mark.adversarial
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Six children each touch 400 MB (2.4 GB together, each under the 512 MB address space
# of RLIMIT_AS), then the parent gives the right answer.
FORKED_MEMORY = """
import os, time
children = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"1" * (400 << 20)
        time.sleep(1.0)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
x = 432
"""


@pytest.mark.skipif(sandbox.memory_scope()[0] != "job",
                    reason=f"no cgroup here: {sandbox.memory_scope()[1]}")
def test_forked_children_share_one_memory_bound():
  limits = sandbox.Limits(timeout_s=20.0, memory_mb=512)
  outcome = sandbox.run_harnessed({"kind": "tests", "tests": "assert x == 432"},
                                  FORKED_MEMORY, limits)
  assert outcome.report is None and outcome.failure.startswith("memory limit exceeded"), \
      outcome
  assert outcome.peak_memory_bytes is not None
  assert outcome.peak_memory_bytes <= 512 << 20, outcome.peak_memory_bytes
  verdict = code.run_tests(FORKED_MEMORY, "assert x == 432", timeout_s=20.0, memory_mb=512)
  assert not verdict.passed and verdict.reason.startswith("memory limit exceeded")
  # One child of 400 MB fits.
  one_child = FORKED_MEMORY.replace("range(6)", "range(1)")
  assert code.run_tests(one_child, "assert x == 432", timeout_s=20.0, memory_mb=512).passed
  assert sandbox_processes() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the tmpfs inode cap needs root")
def test_a_flood_of_empty_files_stops_at_the_inode_cap():
  flood = ("count, error = 0, 0\nwhile True:\n  try:\n"
           "    open(f'/tmp/{count}', 'w').close()\n  except OSError as e:\n"
           "    error = e.errno\n    break\n  count += 1\n")
  start = time.monotonic()
  verdict = code.run_tests(flood, f"assert error == {errno.ENOSPC}, error\n"
                           f"assert 0 < count <= {sandbox.Limits().max_files}, count",
                           timeout_s=5.0)
  assert verdict.passed, verdict
  assert time.monotonic() - start < 5.0
  assert sandbox_processes() == []


TRAINER = """
import sys
from rlhf_jax.sandbox import jobs as sandbox
program = f"import os, time\\ntime.sleep({sys.argv[1]})\\nprint(os.getuid())"
outcome = sandbox.run_job({"mode": "io", "program": program, "inputs": [""]},
                          sandbox.Limits(timeout_s=30.0))
print(outcome.report["outputs"][0].strip() if outcome.report else outcome.failure)
"""


def _trainer(job_sleep_s: float) -> subprocess.Popen:
  """A trainer in a PID namespace of its own, where it is pid 1 (as in a container)."""
  return subprocess.Popen(
      ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c",
       TRAINER, str(job_sleep_s)],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are leased as root only (otherwise a "
                    "user namespace maps each job)")
def test_trainers_in_two_pid_namespaces_get_different_uids():
  """Two trainers, both pid 1 of their PID namespace, run jobs at once: the jobs' uids
  differ (the old pid-derived uids were equal: one RLIMIT_NPROC, and one trainer's
  clean-up killing the other's processes), and the longer job survives the shorter
  one's clean-up."""
  trainers = [_trainer(3.0), _trainer(1.0)]
  outputs = [process.communicate(timeout=120) for process in trainers]
  for (stdout, stderr), process in zip(outputs, trainers):
    assert process.returncode == 0, stderr[-2000:]
  uids = [stdout.strip() for stdout, _ in outputs]
  assert all(uid.isdigit() and int(uid) >= 200_000 for uid in uids), uids
  assert uids[0] != uids[1], uids
  assert sandbox_processes() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another uid needs root")
def test_a_uid_is_leased_only_once_its_leftover_processes_are_gone(tmp_path, monkeypatch):
  """A trainer that died leaves its lock free but maybe a process of its uid (a candidate
  of the rlimits mode): the next lease kills it before the uid is handed out."""
  from rlhf_jax.sandbox import uids as sandbox_uids
  monkeypatch.setenv("RLHF_JAX_SANDBOX_UID_DIR", str(tmp_path))
  uid = sandbox_uids.UID_FIRST
  leftover = subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[])
  try:
    assert sandbox_uids.processes_of(uid) == [leftover.pid]
    with sandbox_uids.lease() as leased:
      assert leased == uid
      assert leftover.wait(timeout=5) == -9  # killed before the uid was handed out
  finally:
    leftover.kill()
