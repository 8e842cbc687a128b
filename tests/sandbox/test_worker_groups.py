"""A worker's process group (sandbox/worker_groups.py), on processes this test starts: the
members and their resident memory read from /proc, and the whole group killed at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlhf_jax.sandbox import worker_groups

# A group leader that starts a child in its group, prints the child's pid once the child
# has started (its interpreter's memory no longer growing while the test reads it), then
# waits.
LEADER = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True);"
          " time.sleep(60)'], stdout=subprocess.PIPE)\n"
          "child.stdout.readline()\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(60)\n")


def resident_bytes(pid):
  """VmRSS of `pid` from /proc/<pid>/status, in bytes (kB there)."""
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    line = next(l for l in f if l.startswith("VmRSS:"))
  return int(line.split()[1]) * 1024


def test_members_are_the_live_processes_of_the_group_with_their_memory():
  leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE,
                            start_new_session=True, text=True)
  try:
    child = int(leader.stdout.readline())
    members = dict(worker_groups.group_members(leader.pid))
    assert set(members) == {leader.pid, child}
    for pid, rss in members.items():
      assert abs(rss - resident_bytes(pid)) <= 1 << 20  # the same pages, read a moment apart
    assert os.getpid() not in members
    worker_groups.kill_group(leader.pid)
    assert leader.wait(timeout=10) == -9
    for _ in range(200):  # the child dies too (a zombie, until reaped, is no member)
      if not worker_groups.group_members(leader.pid):
        break
      time.sleep(0.05)
    assert worker_groups.group_members(leader.pid) == []
  finally:
    worker_groups.kill_group(leader.pid)
    leader.wait(timeout=10)
  worker_groups.kill_group(leader.pid)  # a group that is gone: nothing to do, no error


def test_a_group_with_no_process_has_no_members():
  finished = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
  finished.wait(timeout=10)
  assert worker_groups.group_members(finished.pid) == []
