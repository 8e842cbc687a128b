"""What a sandboxed job left behind, seen from /proc (the adversarial suites' check)."""

import os


def sandbox_processes() -> list[int]:
  """PIDs of live processes running as a sandbox uid (≥ 200000)."""
  pids = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
      continue
    if int(fields["Uid"].split()[0]) >= 200_000 and "Z" not in fields["State"]:
      pids.append(int(name))
  return pids
