"""A simulation of RL step throughput against fleet size, staleness and long-tail lengths.

The model (one line per assumption):
  - a step trains on `batch` samples whose response lengths are log-normal (median
    `median_len`, shape `sigma`), capped at `max_len`;
  - each of `servers` samplers has `slots` slots and decodes one token per busy slot per
    `decode_s` seconds whatever its occupancy (decoding is memory-bound), refilling a slot
    as soon as its sample ends (continuous batching); a batch's samples are dealt to the
    servers round-robin, longest first;
  - the trainer updates in `update_s` seconds, pushes weights in `push_s` and spends
    `loop_s` on its own host work (metrics, logging);
  - with `rollout.max_staleness = k`, batch n may start sampling once version n − k exists
    (the update of batch n − k − 1 has been pushed) and the servers are free; the update of
    batch n starts once batch n is sampled and update n − 1 is done. k = 0 is synchronous.

  python benchmarks/async_sim.py [--steps 200] [--markdown]
  python benchmarks/async_sim.py --calibrate <async_rl.py JSON lines>

Without --calibrate: the table of steps/s relative to synchronous for fleets of 1-8
servers, k = 0, 1, 2, two tail shapes and two update times, at a scale where one step samples 1024 responses.
With --calibrate: the decode, update and loop times are fitted to the synchronous runs of
benchmarks/async_rl.py alone, and the simulated k > 0 seconds per step are printed beside
the measured ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import statistics
import sys

import numpy as np


@dataclasses.dataclass
class Setting:
  """One simulated system."""
  batch: int = 1024
  median_len: float = 1000.0
  sigma: float = 1.0
  max_len: int = 8192
  servers: int = 4
  slots: int = 128
  decode_s: float = 0.03
  update_s: float = 60.0
  push_s: float = 2.0
  loop_s: float = 0.0  # the trainer's own host work per step (metrics, logging)


def sampling_time(lengths: np.ndarray, servers: int, slots: int, decode_s: float) -> float:
  """Seconds until every sample is done: the slowest server's continuous batching."""
  ordered = np.sort(lengths)[::-1]
  finish = 0.0
  for server in range(servers):
    mine = ordered[server::servers]
    free = [0] * min(slots, max(len(mine), 1))  # decode steps at which each slot frees up
    heapq.heapify(free)
    for length in mine:
      heapq.heappush(free, heapq.heappop(free) + max(1, int(round(length))))  # whole tokens
    finish = max(finish, max(free) * decode_s)
  return finish


def simulate(s: Setting, k: int, steps: int, seed: int = 0) -> float:
  """Seconds per step of a run of `steps` steps with staleness bound k."""
  rng = np.random.default_rng(seed)
  sampled_end = 0.0  # when the servers finish the previous batch
  update_end = [0.0]  # update_end[n + 1]: when the update of batch n is pushed
  for n in range(steps):
    lengths = np.minimum(rng.lognormal(np.log(s.median_len), s.sigma, s.batch), s.max_len)
    version_ready = update_end[max(0, n - k)]  # version n − k exists
    start = max(sampled_end, version_ready)
    sampled_end = start + sampling_time(lengths, s.servers, s.slots, s.decode_s)
    update_end.append(max(sampled_end, update_end[-1]) + s.update_s + s.push_s + s.loop_s)
  return update_end[-1] / steps


def table(steps: int) -> list[dict]:
  """Steps/s relative to k = 0 for fleets of 1-8 servers, two tail shapes, two update
  times; `sampling_s` is one batch's sampling time on the fleet (mean)."""
  rows = []
  for update_s in (60.0, 240.0):
    for sigma in (0.5, 1.0):
      for servers in (1, 2, 4, 8):
        s = Setting(servers=servers, sigma=sigma, update_s=update_s)
        rng = np.random.default_rng(1)
        sampling = statistics.mean(sampling_time(np.minimum(
            rng.lognormal(np.log(s.median_len), sigma, s.batch), s.max_len), servers, s.slots,
            s.decode_s) for _ in range(10))
        sync = simulate(s, 0, steps)
        rows.append({"update_s": update_s, "sigma": sigma, "servers": servers,
                     "sampling_s": sampling, "sync_s_per_step": sync,
                     **{f"k{k}_speedup": sync / simulate(s, k, steps) for k in (1, 2)}})
  return rows


def calibrate(lines: list[dict], steps: int) -> list[dict]:
  """Fits decode and update times to the synchronous runs and predicts the others."""
  runs = [r for r in lines if not r.get("summary")]
  sync = [r for r in runs if r["k"] == 0]
  generate = statistics.mean(r["time_generate_mean"] for r in sync)
  update = statistics.mean(r["time_update_mean"] for r in sync)
  # What a synchronous step spends outside sampling and updating.
  loop = statistics.mean(r["s_per_step"] for r in sync) - generate - update
  # The arith workload: 128 samples of ≤ 64 tokens on one 64-slot server; its sampling time
  # is one batch's, so the decode step time is what makes the simulated batch take `generate`.
  s = Setting(batch=128, median_len=30, sigma=0.5, max_len=64, servers=1, slots=64,
              update_s=update, push_s=0.0, loop_s=loop, decode_s=1.0)
  probe = statistics.mean(sampling_time(np.minimum(np.random.default_rng(i).lognormal(
      np.log(30), 0.5, 128), 64), 1, 64, 1.0) for i in range(20))
  s.decode_s = generate / probe
  out = []
  for k in sorted({r["k"] for r in runs}):
    measured = statistics.mean(r["s_per_step"] for r in runs if r["k"] == k)
    out.append({"k": k, "measured_s_per_step": measured,
                "simulated_s_per_step": simulate(s, k, steps),
                "fitted_decode_s": s.decode_s, "fitted_update_s": update,
                "fitted_loop_s": loop})
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--calibrate", default="")
  parser.add_argument("--markdown", action="store_true")
  args = parser.parse_args()
  if args.calibrate:
    rows = calibrate([json.loads(line) for line in open(args.calibrate) if line.strip()],
                     args.steps)
  else:
    rows = table(args.steps)
  for row in rows:
    print(json.dumps(row))
  if args.markdown and rows:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n| " + " | ".join("---" for _ in keys) + " |")
    for row in rows:
      print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                               for v in row.values()) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
