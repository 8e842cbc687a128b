"""What `training/build.py` refuses before any work: the rules of a job of several
processes (`check_job`), the expert axis against the policy's experts
(`check_expert_axis`), each one line naming its field."""

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


def test_the_expert_axis_divides_the_experts_and_a_dense_model_has_none():
  for shards, experts in ((1, 0), (-1, 0), (4, 8), (2, 4), (1, 6)):
    build.check_expert_axis(shards, experts)  # -1: checked once the mesh resolves it
  with pytest.raises(ConfigError, match=r"^config\.mesh\.expert: invalid value 4: must divide "
                     r"the model's 6 experts \(num_experts\)$") as error:
    build.check_expert_axis(4, 6)
  assert error.value.field == "mesh.expert"
  with pytest.raises(ConfigError, match=r"^config\.mesh\.expert: invalid value 2: must be 1 "
                     r"for a dense model \(expert parallelism splits"):
    build.check_expert_axis(2, 0)
