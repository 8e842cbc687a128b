"""Jobs of several processes on loopback for the mesh tests: each process a
`tests.multidevice.distributed_worker` with 8 / processes emulated CPU devices, gloo
collectives (tests/multidevice/test_distributed.py, test_expert_parallel.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MESH = (4, 2, 1)  # data × fsdp: the batch and the FSDP shards both cross the processes
JOB_TIMEOUT_S = 600


def free_port() -> int:
  """A TCP port free on loopback now (the job's coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_job(workdir, name: str, steps: int, processes: int = 2, staleness: int = 0,
              mesh=MESH) -> list[subprocess.Popen]:
  """`processes` workers on loopback, each with 8 / processes CPU devices."""
  port = free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
      "--xla_force_host_platform_device_count=8", "")  # the job sets its own count
  workers = []
  for process_id in range(processes):
    job = {"preset": name, "workdir": str(workdir), "steps": steps, "mesh": mesh,
           "staleness": staleness,
           "port": port, "process_id": process_id, "num_processes": processes,
           "local_devices": 8 // processes}
    log = open(Path(workdir) / f"worker{process_id}.log", "w")
    workers.append(subprocess.Popen(
        [sys.executable, "-m", "tests.multidevice.distributed_worker", json.dumps(job)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
  return workers


def wait(workers, workdir) -> None:
  """Waits for every worker (JOB_TIMEOUT_S in all); a worker that fails or hangs kills the
  job and fails the test with the tail of its log."""
  deadline = time.monotonic() + JOB_TIMEOUT_S
  for process_id, worker in enumerate(workers):
    try:
      code = worker.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      kill(workers)
      code = "timeout"
    if code != 0:
      kill(workers)
      log = (Path(workdir) / f"worker{process_id}.log").read_text()[-4000:]
      pytest.fail(f"worker {process_id} ended with {code}:\n{log}")


def kill(workers) -> None:
  """SIGKILL to each live worker's process group."""
  for worker in workers:
    if worker.poll() is None:
      os.killpg(worker.pid, signal.SIGKILL)
      worker.wait()
