"""What `training/build.py` refuses before any work: the rules of a job of several
processes (`check_job`), each one line naming its field."""

from __future__ import annotations

import jax
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import build
from tests.training.runs import preset
from tests.training.runs import shrink


def one_process_mesh() -> dict[str, int]:
  """Mesh sizes over every device of this process (what check_job gets)."""
  return {"data": jax.device_count(), "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("processes, partial, refused", [
    (2, True, True), (2, False, False), (1, True, False)])
def test_partial_rollouts_are_refused_in_a_job_of_several_processes(
    monkeypatch, processes, partial, refused):
  """Each process takes new weights only between its generations (the gather waits for
  the local generation in flight: sampling/process_shards.py), so a swap under samples
  in flight cannot happen there: refused rather than silently not done."""
  config = shrink(preset("grpo"))
  config.rollout.max_staleness = 1
  config.rollout.partial_rollouts = partial
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  if not refused:
    build.check_job(config, one_process_mesh())
    return
  with pytest.raises(ConfigError) as error:
    build.check_job(config, one_process_mesh())
  assert error.value.field == "rollout.partial_rollouts"
  assert "\n" not in str(error.value)
  assert "must be False in a job of 2 processes" in str(error.value)
