"""The GPU check's tools on CPU (docs/gpu.md): scripts/gpu_check.sh parses and plans within
its budget, benchmarks/gpu.py summarises a check's output, and its --tiny run goes through
the same code paths as the H100 measurement and prints the expected JSON lines."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
GPU_PY = ROOT / "benchmarks" / "gpu.py"


def json_lines(text: str) -> list[dict]:
  return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_gpu_check_script_parses():
  subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_gpu_check_without_a_command_prints_its_usage():
  result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
  assert result.returncode == 2
  assert "prepare" in result.stdout and "run" in result.stdout


@pytest.mark.parametrize("budget", [560, 300])
def test_dry_run_plans_every_step_within_the_budget(tmp_path, budget):
  """As if each step took its whole cap: the steps that run fit the budget, the reserved
  later steps (arith, the bf16 mismatch run, W3) still run, and every step is recorded."""
  env = {**os.environ, "OUT": str(tmp_path / "out"), "RLHF_JAX_GPU_WORK": str(tmp_path / "work"),
         "RLHF_JAX_GPU_PYTHON": sys.executable, "RLHF_JAX_GPU_BUDGET_S": str(budget)}
  result = subprocess.run(["bash", str(SCRIPT), "run", "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  steps = {s["name"]: s for s in summary["steps"]}
  assert list(steps)[:3] == ["env", "tests", "g1_ours"]
  assert {"g1_ours", "g2_ours", "g1b_ours", "g4_ours", "arith", "mismatch", "w3_ours",
          "w3_trl", "slow"} <= set(steps)
  ran = [s for s in summary["steps"] if s["status"] == "dry-run"]
  assert sum(int(s["cap_s"]) for s in ran) <= budget
  for name in ("env", "tests", "g1_ours", "arith", "mismatch", "w3_ours"):
    assert steps[name]["status"] == "dry-run", steps[name]
  # at most 8 files come back from the device: the check writes no more
  assert len(list((tmp_path / "out").iterdir())) <= 8


def test_dry_run_of_one_group_runs_only_its_steps(tmp_path):
  env = {**os.environ, "OUT": str(tmp_path / "out"), "RLHF_JAX_GPU_WORK": str(tmp_path / "work"),
         "RLHF_JAX_GPU_PYTHON": sys.executable}
  subprocess.run(["bash", str(SCRIPT), "run", "bench", "arith", "--dry-run"], check=True,
                 capture_output=True, env=env, timeout=120)
  names = [s["name"] for s in json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]]
  assert names[0] == "g1_ours" and "arith" in names
  assert not {"env", "tests", "mismatch", "w3_ours", "slow"} & set(names)


def test_summary_headline_and_targets(tmp_path):
  records = [
      {"part": "g1", "who": "ours", "median_s": 0.10, "tokens_per_s": 163840.0, "mfu": 0.48,
       "first_step_s": 40.0, "peak_gib": 30.0},
      {"part": "g1", "who": "torch_compile", "median_s": 0.166, "tokens_per_s": 98700.0,
       "mfu": 0.29, "first_step_s": 85.0, "peak_gib": 55.6},
      {"part": "g1b", "who": "ours", "error": "XlaRuntimeError: RESOURCE_EXHAUSTED", "oom": True},
      {"part": "g2", "who": "ours", "reps": 2, "median_s": 2.0, "tokens_per_s": 32768.0,
       "frac_roofline": 0.12, "first_s": 66.0, "compile_cache_entries_at_start": 0},
      {"part": "g2", "who": "ours", "reps": 0, "first_s": 12.0, "first_tokens": 65536,
       "compile_cache_entries_at_start": 40},
      {"part": "mismatch", "who": "ours", "sampler_dtype": "bfloat16",
       "logprob_mismatch_mean": {"median": 0.01}, "logprob_mismatch_max": {"median": 0.2}},
      {"part": "w3", "who": "ours", "s_per_step_median": 1.0, "warmup_s": 20.0},
      {"part": "w3", "who": "trl", "s_per_step_median": 3.0, "warmup_s": 5.0},
  ]
  (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records)
                                        + "not json\n")
  status = tmp_path / "status.tsv"
  status.write_text("env\tok\t0\t4\t30\t\ng1b_ours\tfailed\t1\t50\t90\t\n")
  subprocess.run([sys.executable, str(GPU_PY), "--summarize", str(tmp_path), "--status",
                  str(status), "--budget", "560"], check=True, timeout=60)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert [s["status"] for s in summary["steps"]] == ["ok", "failed"]
  assert summary["elapsed_s"] == 54
  headline, targets = summary["headline"], summary["targets"]
  assert headline["g1"]["ours_speed_over_torch_compile"] == pytest.approx(1.66)
  assert targets == {"g1_mfu_ge_45pct": True, "g1_ahead_of_torch_compile": True,
                     "g1b_32x1024_fits": False, "g2_roofline_ge_50pct": False,
                     "g2_first_call_warm_cache_le_15s": True}
  assert headline["g1b"]["fits"] is False and "RESOURCE_EXHAUSTED" in headline["g1b"]["error"]
  assert headline["g2"]["ours_first_s_warm_cache"] == 12.0
  assert headline["w3"]["trl_over_ours"] == pytest.approx(3.0)
  assert headline["mismatch"]["bfloat16"]["logprob_mismatch_max"] == 0.2
  assert summary["errors"][0]["oom"] is True


def test_mismatch_summary_of_arith_metrics(tmp_path):
  metrics = tmp_path / "metrics.jsonl"
  metrics.write_text("".join(json.dumps(r) + "\n" for r in [
      {"step": 1, "logprob_mismatch_mean": 0.02, "logprob_mismatch_max": 0.5, "reward_mean": 0.1},
      {"step": 2, "logprob_mismatch_mean": 0.04, "logprob_mismatch_max": 0.3, "reward_mean": 0.2},
      {"step": 2, "eval_accuracy": 0.7}]))
  result = subprocess.run([sys.executable, str(GPU_PY), "--mismatch", f"bfloat16={metrics}",
                           f"float32={tmp_path / 'missing.jsonl'}"], check=True,
                          capture_output=True, text=True, timeout=60)
  bf16, fp32 = json_lines(result.stdout)
  assert bf16["sampler_dtype"] == "bfloat16" and bf16["steps"] == 2
  assert bf16["logprob_mismatch_mean"]["median"] == pytest.approx(0.03)
  assert bf16["logprob_mismatch_max"]["max"] == 0.5
  assert bf16["eval_accuracy_last"] == 0.7
  assert "error" in fp32


@pytest.mark.slow
def test_tiny_benchmarks_run_on_cpu():
  """g1 (train step), g2 (decode), g4 (memory table) of our side on a 2-layer model:
  each in its own process, one JSON line per measurement, no errors."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  result = subprocess.run([sys.executable, str(GPU_PY), "--tiny", "--parts", "g1,g2,g4",
                           "--who", "ours"], capture_output=True, text=True, env=env,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  records = json_lines(result.stdout)
  assert all("error" not in r for r in records), records
  by_part = {}
  for r in records:
    by_part.setdefault(r["part"], []).append(r)
  assert set(by_part) == {"g1", "g2", "g4"}
  (g1,), (g2,) = by_part["g1"], by_part["g2"]
  for key in ("median_s", "tokens_per_s", "mfu", "compile_s", "first_step_s", "peak_gib",
              "memory_analysis", "loss", "entropy", "step_s", "flops_per_step"):
    assert key in g1, key
  assert g1["tiny"] and g1["who"] == "ours" and g1["tokens"] == g1["batch"] * g1["seq"]
  assert g1["memory_analysis"]["temp_gib"] >= 0
  for key in ("tokens_per_s", "frac_roofline", "first_s", "hbm_roofline_tokens_per_s",
              "compilations", "median_s"):
    assert key in g2, key
  assert g2["tokens"] == g2["slots"] * g2["new"]  # no stop token: every slot runs to the cap
  assert sorted(r["logprob_chunk"] for r in by_part["g4"]) == [0, 16]
  for r in by_part["g4"]:
    assert r["memory_analysis"]["total_gib"] > 0


def test_compile_log_counts_programs_per_name():
  """benchmarks/compile_time.py --arith-run's parser: JAX_LOG_COMPILES lines per program."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import compile_time  # noqa: E402 (benchmarks/ is no package)
  log = ("WARNING Finished tracing + transforming f for pjit in 0.1 sec\n"
         "WARNING Finished XLA compilation of jit(_generate_impl) in 2.5 sec\n"
         "I1125 Finished XLA compilation of jit(run) in 1.0e-1 sec\n"
         "WARNING Finished XLA compilation of jit(_generate_impl) in 0.5 sec\n")
  counts = compile_time.parse_compile_log(log)
  assert counts["programs"] == 3 and counts["compile_s"] == pytest.approx(3.1)
  assert list(counts["by_name"]) == ["jit(_generate_impl)", "jit(run)"]
  assert counts["by_name"]["jit(_generate_impl)"] == {"count": 2, "seconds": 3.0}


AB_STEPS = ["kern", "g1_xla", "g1_cudnn", "g2_xla"]  # the one call's steps, in order of value
AB2_STEPS = ["kern", "g2_pallas", "g2_pallas_cb", "g1b_cudnn", "g1_cudnn_at0", "g1_cudnn_file"]


def check_env(tmp_path, **extra):
  return {**os.environ, "OUT": str(tmp_path / "out"), "RLHF_JAX_GPU_WORK": str(tmp_path / "work"),
          "RLHF_JAX_GPU_PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize("budget", [560, 400])
def test_ab_dry_run_names_every_step_within_the_budget(tmp_path, budget):
  """`run env ab --dry-run` (the one device call): its steps recorded with their caps
  (each sized for a cold compile), the caps of the steps that run within the budget (the device tool allows 600 s)."""
  result = subprocess.run(["bash", str(SCRIPT), "run", "env", "ab", "--dry-run"],
                          capture_output=True, text=True, timeout=120,
                          env=check_env(tmp_path, RLHF_JAX_GPU_BUDGET_S=str(budget)))
  assert result.returncode == 0 and not result.stderr, result.stderr
  steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
  assert [s["name"] for s in steps] == ["env", *AB_STEPS]
  ran = [s for s in steps if s["status"] == "dry-run"]
  assert sum(int(s["cap_s"]) for s in ran) <= budget
  if budget == 560:
    assert len(ran) == len(steps)  # the whole plan fits the default budget
  for name in ("env", *AB_STEPS):  # reserved: never skipped
    assert next(s for s in steps if s["name"] == name)["status"] == "dry-run"
  total = sum(int(s["cap_s"]) for s in ran)
  assert f"plan of {len(ran)} steps, caps total {total}s within the {budget}s budget" \
      in result.stdout


def test_ab_steps_run_only_when_named(tmp_path):
  subprocess.run(["bash", str(SCRIPT), "run", "--dry-run"], check=True, capture_output=True,
                 env=check_env(tmp_path), timeout=120)
  names = {s["name"] for s in json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]}
  assert "g1_ours" in names and not set(AB_STEPS + AB2_STEPS) & names


def test_test_autotune_level_is_checked(tmp_path):
  result = subprocess.run(["bash", str(SCRIPT), "run", "tests", "--test-autotune-level=9",
                           "--dry-run"], capture_output=True, text=True, env=check_env(tmp_path),
                          timeout=60)
  assert result.returncode == 2 and "0..4" in result.stderr


def test_ab_summary_applies_the_plans_decision_rules(tmp_path):
  g1 = dict(part="g1", who="ours", mfu=0.30, tokens_per_s=1.0, first_step_s=30.0)
  records = [
      {"part": "kern", "step": "kern", "impl": "cudnn", "layout": "packed", "ok": False,
       "errors": {"out": 0.5}},
      {"part": "kern", "step": "kern", "verdict": {"cudnn": False, "pallas": True,
                                                   "decode_pallas": True}},
      {**g1, "step": "g1_xla", "median_s": 0.20, "loss_step0": 2.000, "compile_s": 40.0},
      {**g1, "step": "g1_cudnn", "median_s": 0.10, "loss_step0": 2.010, "compile_s": 60.0,
       "mfu": 0.40, "attention_impl": "pallas"},
      {"part": "g1b", "who": "ours", "step": "g1b_cudnn", "error": "RESOURCE_EXHAUSTED",
       "oom": True},
      {"part": "g2", "who": "ours", "step": "g2_pallas", "tokens_per_s": 60000.0,
       "frac_roofline": 0.30},
      {"part": "g2", "who": "ours", "step": "g2_pallas_cb", "tokens_per_s": 90000.0,
       "frac_roofline": 0.36},
      {"part": "g2", "who": "ours", "step": "g2_xla", "tokens_per_s": 30000.0,
       "frac_roofline": 0.12},
      {**g1, "step": "g1_cudnn_at0", "median_s": 0.104, "compile_s": 24.0},
      {**g1, "step": "g1_cudnn_file", "median_s": 0.10, "compile_s": 30.0,
       "autotune_loaded": "/x/nvidia-h100-80gb-hbm3-jaxlib0.11.2.textproto"},
  ]
  (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  subprocess.run([sys.executable, str(GPU_PY), "--summarize", str(tmp_path)], check=True,
                 timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
  summary = json.loads((tmp_path / "summary.json").read_text())
  ab, targets = summary["headline"]["ab"], summary["targets"]
  assert ab["kern"]["cudnn"] is False and ab["kern_failed"][0]["layout"] == "packed"
  assert ab["g1"]["fused_over_xla"] == pytest.approx(2.0)
  assert ab["g1"]["loss_step0_rel_diff"] == pytest.approx(0.005)
  assert ab["g2"]["pallas_over_xla"] == pytest.approx(2.0)
  assert ab["g2"]["command_buffers_over_pallas"] == pytest.approx(1.5)
  assert ab["compile"]["autotuning_share_of_compile"] == pytest.approx(0.6)
  assert ab["compile"]["loaded_over_full"] == pytest.approx(0.5)
  assert targets == {"g1_ahead_of_torch_compile": True, "g1_mfu_ge_35pct": True,
                     "g1_fused_loss_matches_xla": True, "g1b_32x1024_runs": False,
                     "g2_roofline_ge_35pct": True, "autotune_level0_for_gpu_tests": True}
  assert "g1" not in summary["headline"]  # the ab records are not read as the bench group's


@pytest.mark.slow
def test_tiny_run_goes_through_every_path_of_the_one_call(tmp_path):
  """`gpu.py --tiny --parts kern,g1,g2` with the Pallas kernels (interpret mode) and profiles,
  as GPU_PLAN §3 asks before a call: no error; cuDNN skipped off a GPU, said so."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  result = subprocess.run([sys.executable, str(GPU_PY), "--tiny", "--parts", "kern,g1,g2",
                           "--attention", "pallas", "--decode-attention", "pallas",
                           "--profile", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  records = json_lines(result.stdout)
  assert not [r for r in records if "error" in r], records
  kern = [r for r in records if r["part"] == "kern"]
  assert all("GPU" in r["skipped"] for r in kern if r.get("impl") == "cudnn")
  verdict = kern[-1]["verdict"]
  assert verdict["cudnn"] is None and verdict["decode_pallas"] is True
  assert verdict["pallas"] is True or all(  # or not built yet, said so
      "not built" in r["skipped"] for r in kern if r.get("impl") == "pallas")
  (g1,) = [r for r in records if r["part"] == "g1"]
  (g2,) = [r for r in records if r["part"] == "g2"]
  assert g1["attention_impl"] == "pallas" and "loss_step0" in g1 and "compile_s" in g1
  assert g2["decode_attention"] == "pallas" and g2["tokens_per_s"] > 0
  for part in ("g1", "g2"):
    assert (tmp_path / f"profile_{part}.json.gz").stat().st_size > 0


@pytest.mark.slow  # the whole check script with its env step (imports jax and torch)
def test_compile_cache_comes_back_and_is_restored(tmp_path):
  """The cache a call packs into $OUT is what the next call (carrying it) starts from."""
  import tarfile
  seed = tmp_path / "seed" / "jax_cache"
  seed.mkdir(parents=True)
  (seed / "jit_step-abc123").write_bytes(b"x" * 1000)
  archive = tmp_path / "carried.tgz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(seed, arcname="jax_cache")
  env = check_env(tmp_path, JAX_PLATFORMS="cpu", RLHF_JAX_GPU_CACHE_TGZ=str(archive))
  subprocess.run(["bash", str(SCRIPT), "run", "env"], check=True, capture_output=True, env=env,
                 timeout=300)
  steps = {s["name"]: s for s in
           json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]}
  assert steps["cache_restore"]["status"] == "ok" and steps["cache_pack"]["status"] == "ok"
  with tarfile.open(tmp_path / "out" / "jax_cache.tgz") as tar:
    assert "jax_cache/jit_step-abc123" in tar.getnames()
  assert len([p for p in (tmp_path / "out").rglob("*") if p.is_file()]) <= 8
