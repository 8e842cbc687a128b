"""One process of a trainer job of several processes (tests/multidevice/test_distributed.py).

  python -m tests.multidevice.distributed_worker '<json: preset, workdir, steps, mesh,
      port, process_id, num_processes, local_devices>'

Runs the job's Trainer to `steps` and exits; process 0 writes metrics and the policy.
"""

import json
import os
import sys


def main() -> None:
  job = json.loads(sys.argv[1])
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
