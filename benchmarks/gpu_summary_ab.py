"""The headline of `scripts/gpu_check.sh run env ab` and `ab2` (shared/bench/GPU_PLAN.md §3):
each of its records carries the step that wrote it (`step`), and this reads them into the
figures the plan's decision rules need, with the targets met or not.

  g1    XLA attention vs the fused kernel at 16 × 1024: step time, MFU, the speed-up, the
        step-0 losses equal within 1e-2 relative, against torch.compile's 0.165 s on the same H100;
  g1b   32 × 1024 with the fused kernel: runs, peak memory, or the error;
  g2    the Pallas decode with and without CUDA-graph command buffers, and the XLA decode:
        tokens/s and the fraction of the HBM roofline;
  compile  the fused G1 step's compile seconds cold with full autotuning (g1_cudnn), with
        autotuning off (level 0) and with the autotune results loaded; the rule: level 0 for
        the GPU test suite if it halves the compile and moves the step time ≤ 5 %.
"""

from __future__ import annotations

AB_STEPS = ("kern", "g1_xla", "g1_cudnn", "g2_pallas", "g2_pallas_cb", "g1b_cudnn", "g2_xla",
            "g1_cudnn_at0", "g1_cudnn_file")
TORCH_COMPILE_G1_S = 0.165  # torch.compile on the same H100: the step time to beat


def _by_step(records: list[dict]) -> dict:
  """The last record of each ab step (kern: its verdict record)."""
  out = {}
  for r in records:
    step = r.get("step")
    if step in AB_STEPS and (step != "kern" or "verdict" in r):
      out[step] = r
  return out


def _pick(record, *keys):
  if record is None:
    return None
  if "skipped" in record:  # a kernel kern did not find ok, or not built
    return {"skipped": str(record["skipped"])[:300]}
  if "error" in record:  # a timeout's record says where the step's log stopped
    return {"error": str(record["error"])[:300],
            **({"last_log_line": record["last_log_line"]} if "last_log_line" in record else {})}
  return {k: record.get(k) for k in keys if k in record}


def _ratio(a, b):
  return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def ab_headline(records: list[dict]) -> tuple[dict, dict]:
  """(headline, targets) of an ab run's records; ({}, {}) when none of them is there."""
  steps = _by_step(records)
  if not steps:
    return {}, {}
  ok = lambda name: (steps.get(name) if steps.get(name) and "error" not in steps[name]
                     and "skipped" not in steps[name] else None)
  head, targets = {}, {}
  if "kern" in steps:
    head["kern"] = steps["kern"]["verdict"]
    head["kern_cases"] = steps["kern"].get("cases")  # {impl: {layout: ok|wrong|crashed|skipped}}
    failed = [r for r in records if r.get("step") == "kern" and r.get("ok") is False]
    head["kern_failed"] = [{k: r.get(k) for k in ("impl", "layout", "status", "errors",
                                                  "first_error")} for r in failed]
  train = ("attention_impl", "median_s", "mfu", "tokens_per_s", "compile_s", "first_step_s",
           "loss_step0", "peak_gib", "autotune_loaded", "profile")
  head["g1"] = {name: _pick(steps.get(name), *train) for name in ("g1_xla", "g1_cudnn")}
  xla, fused = ok("g1_xla"), ok("g1_cudnn")
  if fused:
    head["g1"]["fused_over_xla"] = _ratio(xla and xla["median_s"], fused["median_s"])
    head["g1"]["torch_compile_s"] = TORCH_COMPILE_G1_S
    targets["g1_ahead_of_torch_compile"] = fused["median_s"] < TORCH_COMPILE_G1_S
    targets["g1_mfu_ge_35pct"] = fused["mfu"] >= 0.35
    if xla:
      rel = abs(fused["loss_step0"] - xla["loss_step0"]) / max(abs(xla["loss_step0"]), 1e-9)
      head["g1"]["loss_step0_rel_diff"] = rel
      targets["g1_fused_loss_matches_xla"] = rel <= 1e-2
  if "g1b_cudnn" in steps:
    head["g1b"] = _pick(steps["g1b_cudnn"], "attention_impl", "median_s", "mfu", "peak_gib")
    targets["g1b_32x1024_runs"] = ok("g1b_cudnn") is not None
  gen = ("decode_attention", "tokens_per_s", "frac_roofline", "first_s", "profile")
  head["g2"] = {name: _pick(steps.get(name), *gen) for name in ("g2_pallas", "g2_pallas_cb",
                                                                "g2_xla")}
  pallas, graphs, base = ok("g2_pallas"), ok("g2_pallas_cb"), ok("g2_xla")
  rate = lambda r: r and r.get("tokens_per_s")
  head["g2"]["pallas_over_xla"] = _ratio(rate(pallas), rate(base))
  head["g2"]["command_buffers_over_pallas"] = _ratio(rate(graphs), rate(pallas))
  best = max((r for r in (pallas, graphs) if r and "frac_roofline" in r),
             key=lambda r: r["frac_roofline"], default=None)
  if best:
    targets["g2_roofline_ge_35pct"] = best["frac_roofline"] >= 0.35
  head["compile"] = _compile(ok("g1_cudnn"), ok("g1_cudnn_at0"), ok("g1_cudnn_file"), targets)
  return head, targets


def _compile(full, level0, loaded, targets) -> dict:
  """Compile seconds of the fused G1 step three ways, and the autotune-level rule."""
  out = {"full_autotune_s": full and full["compile_s"],
         "autotune_level0_s": level0 and level0["compile_s"],
         "results_loaded_s": loaded and loaded["compile_s"],
         "results_file": loaded and loaded.get("autotune_loaded")}
  if full and level0:
    compile_share = 1 - level0["compile_s"] / full["compile_s"]
    step_change = level0["median_s"] / full["median_s"] - 1
    out.update(autotuning_share_of_compile=compile_share, level0_step_time_change=step_change)
    targets["autotune_level0_for_gpu_tests"] = compile_share >= 0.5 and abs(step_change) <= 0.05
  if full and loaded:
    out["loaded_over_full"] = loaded["compile_s"] / full["compile_s"]
  return out
