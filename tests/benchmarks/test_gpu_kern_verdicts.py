"""The GPU check's decisions after its first run on the H200 (docs/gpu.md): kern's cases each in
a process of their own, ok / wrong / crashed apart; the kernel a step may use (never one that
failed kern); the record of a step stopped at its cap, with its log's last line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_kern  # noqa: E402 (benchmarks/ is no package)

ILLEGAL = ("JaxRuntimeError: INTERNAL: CUDA error: Failed to check stream capturing status: "
           "CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered")


def fake_case(impl: str, name: str, tiny: bool, seed: int, compile_cache) -> list[str]:
  """A case's process as a few lines of Python: cudnn/padded dies as a sticky CUDA error
  kills a process, pallas/padded is beyond the tolerance, the others are within it."""
  if (impl, name) == ("cudnn", "padded"):
    body = (f"import sys; print('E1128 cuda_executor.cc:313] {ILLEGAL}', file=sys.stderr); "
            "sys.exit(134)")
  else:
    error = 0.5 if (impl, name) == ("pallas", "padded") else 0.001
    row = {"impl": impl, "layout": name, "device": "NVIDIA H200", "errors": {"out": error},
           "ok": error <= 0.02, "status": "ok" if error <= 0.02 else "wrong"}
    body = f"print({json.dumps(json.dumps(row))})"
  return [sys.executable, "-c", body]


def test_a_crashing_case_does_not_poison_the_others_and_is_told_from_a_wrong_one():
  """The H200's run: cuDNN's padded case hit CUDA_ERROR_ILLEGAL_INSTRUCTION. In its own
  process it is `crashed` with that line; the cases after it keep their own results."""
  emitted = []
  final = gpu_kern.run_kern(False, ["cudnn", "pallas"], emitted.append, {"who": "ours"},
                            command=fake_case)
  status = {(r["impl"], r["layout"]): r["status"] for r in emitted if "status" in r}
  assert status == {("cudnn", "causal"): "ok", ("cudnn", "padded"): "crashed",
                    ("cudnn", "packed"): "ok", ("pallas", "causal"): "ok",
                    ("pallas", "padded"): "wrong", ("pallas", "packed"): "ok",
                    ("decode_pallas", "left_padded_ragged"): "ok"}
  crashed = next(r for r in emitted if r.get("status") == "crashed")
  assert "CUDA_ERROR_ILLEGAL_INSTRUCTION" in crashed["first_error"]
  assert "status 134" in crashed["error"]
  assert final["verdict"] == {"cudnn": False, "pallas": False, "decode_pallas": True}
  assert final["cases"]["cudnn"] == {"causal": "ok", "padded": "crashed", "packed": "ok"}
  assert final["device"] == "NVIDIA H200" and emitted[-1] is final


@pytest.mark.parametrize("returncode, stdout, stderr, status, first", [
    (0, json.dumps({"impl": "cudnn", "status": "wrong", "ok": False}), "", "wrong", None),
    (0, json.dumps({"impl": "cudnn", "status": "crashed", "first_error": ILLEGAL}), "",
     "crashed", ILLEGAL),
    (-6, "", "[gpu.py +0.1s] kern case\nF1128 Check failed: stream ok\nnext\n", "crashed",
     "F1128 Check failed: stream ok"),
    (None, "", "[gpu.py +0.1s] kern case cudnn/packed: starting the backend\n", "crashed",
     "the case's process timed out"),
    (1, "", "", "crashed", "the case's process exited with status 1")])
def test_case_record_reads_what_the_process_left(returncode, stdout, stderr, status, first):
  record = gpu_kern.case_record("cudnn", "packed", returncode, stdout, stderr)
  assert record["status"] == status
  assert record.get("first_error") == first


def verdict_row(cases: dict) -> dict:
  return {"part": "kern", "verdict": {}, "cases": cases}


OK3 = {"causal": "ok", "padded": "ok", "packed": "ok"}


@pytest.mark.parametrize("rows, g1, g2", [
    ([], "skip: kern gave no verdict", "skip: kern gave no verdict"),
    ([verdict_row({"cudnn": OK3, "pallas": OK3, "decode_pallas": {"left_padded_ragged": "ok"}})],
     "cudnn", "pallas"),
    # the H200: cuDNN causal ok, padded crashed (G1 takes the padded form): Pallas, if ok
    ([verdict_row({"cudnn": {**OK3, "padded": "crashed"}, "pallas": OK3})], "pallas",
     "skip: the Pallas decode did not pass kern (not run)"),
    # G1 does not use the causal form: a crash there does not keep cuDNN from G1
    ([verdict_row({"cudnn": {**OK3, "causal": "wrong"}, "pallas": {}})], "cudnn", None),
    ([verdict_row({"cudnn": {**OK3, "padded": "crashed"}, "pallas": {**OK3, "padded": "wrong"},
                   "decode_pallas": {"left_padded_ragged": "crashed"}})],
     "skip: no fused kernel passed kern on the layout G1 uses (cudnn padded crashed, "
     "pallas padded wrong)", "skip: the Pallas decode did not pass kern (crashed)"),
    ([verdict_row({"cudnn": {"padded": "skipped"}, "pallas": {"padded": "skipped"}})],
     "skip: no fused kernel passed kern", None)])
def test_a_step_never_gets_a_kernel_that_failed_kern(rows, g1, g2):
  assert gpu_kern.choose("g1", rows).startswith(g1)
  if g2 is not None:
    assert gpu_kern.choose("g2", rows).startswith(g2)


def check_env(tmp_path) -> dict:
  return {**os.environ, "OUT": str(tmp_path / "out"), "RLHF_JAX_GPU_WORK": str(tmp_path / "work"),
          "RLHF_JAX_GPU_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}


def test_a_g1_step_without_a_fused_kernel_is_skipped_with_the_reason(tmp_path):
  """gpu_check.sh's g1_cudnn after the H200's kern: skipped (exit 3, its own record), not run
  on cuDNN; the summary says skipped and why."""
  (tmp_path / "out").mkdir()
  (tmp_path / "work" / "logs").mkdir(parents=True)
  row = verdict_row({"cudnn": {**OK3, "padded": "crashed"}, "pallas": {**OK3, "padded": "crashed"}})
  (tmp_path / "out" / "bench.jsonl").write_text(json.dumps(row) + "\n")
  env = check_env(tmp_path)
  log = tmp_path / "work" / "logs" / "g1_cudnn.log"
  with open(log, "w") as out:
    step = subprocess.run(["bash", str(SCRIPT), "_step", "g1_cudnn"], stdout=out, stderr=out,
                          env=env, timeout=120)
  assert step.returncode == 3, log.read_text()
  subprocess.run(["bash", str(SCRIPT), "_finish_step", "g1_cudnn", "3", "1", "160"], env=env,
                 check=True, timeout=120, capture_output=True)
  records = [json.loads(line) for line in (tmp_path / "out" / "bench.jsonl").open()]
  assert records[-1]["step"] == "g1_cudnn" and "no fused kernel passed kern" in records[-1]["skipped"]
  steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
  assert steps[-1]["status"] == "skipped" and "no fused kernel passed kern" in steps[-1]["note"]


def test_a_timeout_record_carries_the_logs_last_line(tmp_path):
  """A step stopped at its cap: bench.jsonl's error record and summary.json's step note say
  where its log stopped (gpu.py's last progress line, not the stack dump after it)."""
  (tmp_path / "out").mkdir()
  (tmp_path / "work" / "logs").mkdir(parents=True)
  (tmp_path / "work" / "logs" / "g1_xla.log").write_text(
      "[gpu.py +0.1s] g1 ours: starting\n"
      "[gpu.py +4.2s] g1: built in 3.1 s; compiling the step\n"
      "Current thread 0x00007f (most recent call first):\n"
      '  File "benchmarks/gpu_ours.py", line 120 in train_ours\n\n')
  subprocess.run(["bash", str(SCRIPT), "_finish_step", "g1_xla", "124", "160", "160"],
                 env=check_env(tmp_path), check=True, timeout=120, capture_output=True)
  (record,) = [json.loads(line) for line in (tmp_path / "out" / "bench.jsonl").open()]
  assert record == {"part": "g1", "who": "ours", "step": "g1_xla",
                    "error": "timed out after 160 s (gpu_check.sh)",
                    "last_log_line": "[gpu.py +4.2s] g1: built in 3.1 s; compiling the step"}
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  (step,) = summary["steps"]
  assert step["status"] == "timeout" and step["note"].endswith("compiling the step")
  assert summary["headline"]["ab"]["g1"]["g1_xla"]["last_log_line"] == record["last_log_line"]


@pytest.mark.slow
def test_a_real_step_stopped_at_its_cap_says_where_it_was(tmp_path):
  """`run g1_xla` on CPU with a 20-s cap (the 0.5B model cannot even be built in it): the
  step times out, its log holds gpu.py's progress lines and the stack SIGTERM printed, and
  the timeout's record carries the last progress line."""
  env = {**check_env(tmp_path), "JAX_PLATFORMS": "cpu", "RLHF_JAX_GPU_CAPS": "g1_xla=20"}
  subprocess.run(["bash", str(SCRIPT), "run", "g1_xla"], env=env, check=True, timeout=300,
                 capture_output=True)
  (record,) = [json.loads(line) for line in (tmp_path / "out" / "bench.jsonl").open()]
  assert record["error"] == "timed out after 20 s (gpu_check.sh)"
  assert record["last_log_line"].startswith("[gpu.py +")
  log = (tmp_path / "work" / "logs" / "g1_xla.log").read_text()
  assert "(most recent call first)" in log and record["last_log_line"] in log


def test_the_second_ab_call_checks_the_kernels_again_before_its_steps(tmp_path):
  """`run env ab2 --dry-run`: kern first (a new machine), then the Pallas decode and G1b
  within the budget; the two compile variants only when time is left (their floors)."""
  result = subprocess.run(["bash", str(SCRIPT), "run", "env", "ab2", "--dry-run"],
                          capture_output=True, text=True, env=check_env(tmp_path), timeout=120)
  assert result.returncode == 0, result.stderr
  steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
  status = {s["name"]: s["status"] for s in steps}
  assert list(status) == ["env", "kern", "g2_pallas", "g2_pallas_cb", "g1b_cudnn",
                          "g1_cudnn_at0", "g1_cudnn_file"]
  assert [n for n, s in status.items() if s == "skipped"] == ["g1_cudnn_at0", "g1_cudnn_file"]
  assert sum(int(s["cap_s"]) for s in steps if s["status"] == "dry-run") <= 560
