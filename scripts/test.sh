#!/usr/bin/env bash
# The whole test suite: installs rlhf-jax[test] into .venv, then runs pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k gae`).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_venv test
cd "$ROOT"
export JAX_PLATFORMS=cpu OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
run_pytest() {  # pytest's exit 5 (nothing selected) is fine only when the caller filtered
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -eq 5 ] && [ "$FILTERED" -eq 1 ]; then rc=0; fi
  return "$rc"
}
FILTERED=$(( $# > 0 ))
# 3) the code sandbox's adversarial suite (fork bombs, kill(-1), memory bombs, forged
#    verdicts, forked memory, inode floods, uid collisions, ...), in a
#    PID namespace of its own, bounded in time: whatever escaped the sandbox ends there
#    (the suite refuses to start in the PID namespace it was launched from). It mostly
#    waits out hostile programs' timeouts, so with RLHF_JAX_TEST_WORKERS set it runs beside
#    1) and 2), and its report follows theirs.
PIDNS=(unshare --pid --fork --mount-proc --kill-child)
if [ "$(id -u)" -ne 0 ]; then PIDNS=(unshare --user --map-current-user --pid --fork --mount-proc --kill-child); fi
ADVERSARIAL=(env RLHF_JAX_OUTER_PIDNS="$(stat -L -c %i /proc/self/ns/pid)" "${PIDNS[@]}"
             timeout 600 "$VENV/bin/python" -m pytest -p no:cacheprovider --suite=adversarial
             tests/sandbox "$@")
ADVERSARIAL_PID=""
if [ -n "${RLHF_JAX_TEST_WORKERS:-}" ]; then
  ADVERSARIAL_LOG="$(mktemp)"
  "${ADVERSARIAL[@]}" >"$ADVERSARIAL_LOG" 2>&1 &
  ADVERSARIAL_PID=$!
  # unshare --kill-child: ending it ends the namespace, should 1) or 2) fail first
  trap 'kill "$ADVERSARIAL_PID" 2>/dev/null || true; rm -f "$ADVERSARIAL_LOG"' EXIT
fi
# 1) everything that runs on one device; RLHF_JAX_TEST_WORKERS=N spreads it over N
#    pytest-xdist workers (the quick subset on 2 cores: N=2), this part only
WORKERS=()
if [ -n "${RLHF_JAX_TEST_WORKERS:-}" ]; then WORKERS=(-n "$RLHF_JAX_TEST_WORKERS"); fi
run_pytest "$VENV/bin/python" -m pytest "${WORKERS[@]}" "$@"
# 2) the mesh tests, in their own process with 8 emulated CPU devices (the device
#    count is fixed when JAX starts, so it cannot share the process above)
XLA_FLAGS="--xla_force_host_platform_device_count=8 ${XLA_FLAGS:-}" \
  run_pytest "$VENV/bin/python" -m pytest --suite=multidevice tests/multidevice "$@"
if [ -z "$ADVERSARIAL_PID" ]; then
  run_pytest "${ADVERSARIAL[@]}"
else
  run_pytest wait "$ADVERSARIAL_PID" || { rc=$?; cat "$ADVERSARIAL_LOG"; exit "$rc"; }
  cat "$ADVERSARIAL_LOG"
fi
