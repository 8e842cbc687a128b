"""A trainer job of 2 processes × 4 CPU devices (gloo collectives, loopback) against
1 process × 8 devices: the same metrics and parameters, and an exact resume after both
processes are killed."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rlhf_jax.training import stages
from tests.multidevice.jobs import JOB_TIMEOUT_S
from tests.multidevice.jobs import MESH
from tests.multidevice.jobs import kill
from tests.multidevice.jobs import start_job
from tests.multidevice.jobs import wait
from tests.training.runs import preset
from tests.training.runs import make_trainer
from tests.training.runs import records
from tests.training.runs import shrink


def job_config(name: str, *, mesh=MESH, steps: int = 2, staleness: int = 0):
  """The tiny preset both jobs run (the worker builds it the same way)."""
  config = shrink(preset(name))
  config.rollout.max_staleness = staleness
  config.model.num_heads = 4
  config.rollout.prompts_per_step = 8  # 32 rows: 4 per data × fsdp shard
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  config.train.steps, config.train.eval_every, config.train.checkpoint_every = steps, steps, 2
  config.train.loggers = ""
  return config


def warm_start(config, workdir) -> None:
  stages.ensure_arith_warm_start(config, str(workdir), log=lambda line: None)


def policy(workdir) -> dict:
  return load_file(str(Path(workdir) / "policy" / "model.safetensors"))


def assert_same_run(got_dir, expected_dir) -> None:
  got, expected = records(Path(got_dir)), records(Path(expected_dir))
  assert [r["step"] for r in got] == [r["step"] for r in expected]
  # Same rollouts: each process samples its share with the seeds of the one-process call.
  for key in ("reward_mean", "response_length_mean", "accuracy", "eval_accuracy"):
    assert [r.get(key) for r in got] == [r.get(key) for r in expected], key
  for key in ("loss", "pg_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose([r[key] for r in got if key in r],
                               [r[key] for r in expected if key in r],
                               rtol=2e-4, atol=1e-5, err_msg=key)
  got_params, expected_params = policy(got_dir), policy(expected_dir)
  assert sorted(got_params) == sorted(expected_params)
  for name, value in expected_params.items():
    np.testing.assert_allclose(got_params[name], value, atol=1e-4, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("name, staleness", [("ppo", 0), ("grpo", 0), ("grpo", 1)])
def test_two_processes_match_one_process(name, staleness, tmp_path):
  """Synchronous, and with generation one version ahead (k = 1: every process samples its
  share on its worker thread, weights prepared on the trainer's thread)."""
  one, two = tmp_path / "one", tmp_path / "two"
  config = job_config(name, staleness=staleness, steps=3 if staleness else 2)
  warm_start(config, one)
  warm_start(config, two)
  make_trainer(config, one).run()
  wait(start_job(two, name, steps=config.train.steps, staleness=staleness), two)
  assert_same_run(two, one)
  if staleness:
    assert records(Path(two))[-1]["staleness/mean_version_lag"] == 1


@pytest.mark.slow
def test_a_killed_job_resumes_exactly(tmp_path):
  whole, resumed = tmp_path / "whole", tmp_path / "resumed"
  config = job_config("grpo", steps=4)
  warm_start(config, whole)
  warm_start(config, resumed)
  make_trainer(config, whole).run()
  workers = start_job(resumed, "grpo", steps=4)
  metrics = resumed / "metrics.jsonl"
  deadline = time.monotonic() + JOB_TIMEOUT_S
  # Step 3's record comes after the step-2 checkpoint: kill both processes mid-run.
  while not (metrics.exists() and any(json.loads(line)["step"] == 3
                                      for line in metrics.read_text().splitlines())):
    assert time.monotonic() < deadline and all(w.poll() is None for w in workers), (
        (resumed / "worker0.log").read_text()[-4000:])
    time.sleep(0.2)
  kill(workers)
  assert not (resumed / "policy").exists()
  wait(start_job(resumed, "grpo", steps=4), resumed)
  assert "resumed from step 2" in (resumed / "worker0.log").read_text()
  assert_same_run(resumed, whole)
