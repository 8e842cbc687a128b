"""One process of a trainer job of several processes (tests/multidevice/test_distributed.py).

  python -m tests.multidevice.distributed_worker '<json: preset, workdir, steps, mesh,
      port, process_id, num_processes, local_devices>'

Runs the job's Trainer to `steps` and exits; process 0 writes metrics and the policy. With
"preset": "moe_gradients" (tests/multidevice/test_expert_parallel.py) it computes a tiny
Qwen3-MoE's loss and gradients on a data × expert mesh instead; process 0 writes them to
<workdir>/gradients.npz.
"""

import json
import os
import sys


def moe_gradients(job) -> None:
  """The expert-parallel job: loss and gradients of the tiny Qwen3-MoE across the processes."""
  import numpy as np
  from rlhf_jax import parallel
  from tests.multidevice.test_expert_parallel import moe_gradients as compute

  d = parallel.distributed_config()
  d.coordinator_address = f"127.0.0.1:{job['port']}"
  d.num_processes, d.process_id = job["num_processes"], job["process_id"]
  d.local_device_count = job["local_devices"]
  assert parallel.initialize(d)
  import jax
  assert jax.process_count() == job["num_processes"] and jax.device_count() == 8
  data, expert = job["mesh"]
  values = compute(parallel.make_mesh(data=data, expert=expert))
  if jax.process_index() == 0:
    np.savez(os.path.join(job["workdir"], "gradients.npz"), **values)


def main() -> None:
  job = json.loads(sys.argv[1])
  if job["preset"] == "moe_gradients":
    moe_gradients(job)
    return
  from rlhf_jax import parallel
  from rlhf_jax.runtime import enable_compile_cache
  from tests.multidevice.test_distributed import job_config
  from rlhf_jax.training import loop
  from tests.training.runs import scorer

  enable_compile_cache(os.environ.get("RLHF_JAX_TEST_COMPILE_CACHE",
                                      "~/.cache/rlhf_jax/xla-tests"), min_compile_s=0.2)
  config = job_config(job["preset"], mesh=tuple(job["mesh"]), steps=job["steps"],
                      staleness=job["staleness"])
  d = config.distributed
  d.coordinator_address = f"127.0.0.1:{job['port']}"
  d.num_processes, d.process_id = job["num_processes"], job["process_id"]
  d.local_device_count = job["local_devices"]
  assert parallel.initialize(d)
  import jax
  assert jax.process_count() == job["num_processes"], jax.process_count()
  assert jax.local_device_count() == job["local_devices"] and jax.device_count() == 8
  # The warm start is in the workdir already (the test trains it once).
  loop.Trainer(config, job["workdir"], log=lambda line: print(line, flush=True),
               scorer=scorer(config)).run()


if __name__ == "__main__":
  main()
