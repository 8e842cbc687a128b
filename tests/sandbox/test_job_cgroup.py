"""A cgroup per code job (sandbox/job_cgroup.py): cgroup v2's files set and read."""

from __future__ import annotations

from rlhf_jax.sandbox import job_cgroup


def test_a_v2_job_cgroup_sets_and_reads_its_files(tmp_path):
  """cgroup v2's files, on a directory that stands in for the cgroup tree (the machines
  that run the adversarial suite may have v1 only)."""
  cgroup = job_cgroup.JobCgroup({"v2": str(tmp_path)}, 512 << 20, 12)
  (directory,) = cgroup.dirs.values()
  read = lambda name: open(f"{directory}/{name}").read()  # pylint: disable=unnecessary-lambda-assignment
  assert (read("memory.max"), read("memory.swap.max"), read("pids.max")) == (
      str(512 << 20), "0", "12")
  assert cgroup.procs_files == [f"{directory}/cgroup.procs"]
  with open(f"{directory}/memory.events", "w") as f:
    f.write("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
  with open(f"{directory}/memory.peak", "w") as f:
    f.write("536870912\n")
  assert cgroup.oom_kills() == 2 and cgroup.peak_bytes() == 512 << 20
  cgroup.close(patience_s=0.0)
  assert read("cgroup.kill") == "1"
