"""scripts/gpu_check.sh's summaries, written by benchmarks/gpu.py: the trainer-sampler
mismatch of the arith runs (--mismatch) and OUT/summary.json (--summarize)."""

from __future__ import annotations

import json
import os
import statistics

from gpu_common import _finite, emit

import gpu_summary_ab


MISMATCH_KEYS = ("logprob_mismatch_mean", "logprob_mismatch_max", "is_ratio_min", "is_ratio_max",
                 "is_ratio_mean")


def read_jsonl(path) -> list[dict]:
  rows = []
  if not path or not os.path.exists(path):
    return rows
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(row, dict):
        rows.append(row)
  return rows


def mismatch_records(specs: list[str]) -> None:
  """--mismatch LABEL=metrics.jsonl ...: the trainer–sampler log-prob mismatch of an arith
  run (rlhf_jax.kernels.rollout_correction's metrics over fresh tokens), one line per run."""
  for spec in specs:
    label, _, path = spec.partition("=")
    rows = [r for r in read_jsonl(path) if any(k in r for k in MISMATCH_KEYS)]
    record = {"part": "mismatch", "who": "ours", "sampler_dtype": label, "metrics_file": path,
              "steps": len(rows)}
    if not rows:
      record["error"] = f"no mismatch metrics in {path} (missing or the run failed)"
      emit(record)
      continue
    for key in MISMATCH_KEYS:
      values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
      if values:
        record[key] = {"median": statistics.median(values), "max": max(values),
                       "min": min(values), "first": values[0], "last": values[-1]}
    for key in ("reward_mean", "accuracy", "eval_accuracy"):
      values = [r[key] for r in read_jsonl(path) if isinstance(r.get(key), (int, float))]
      if values:
        record[f"{key}_last"] = values[-1]
    emit(record)


def _ok(records, part, who, pred=lambda r: True):
  """The last error-free record of (part, who) that satisfies `pred`."""
  found = [r for r in records if r.get("part") == part and r.get("who") == who
           and "error" not in r and pred(r)]
  return found[-1] if found else None


def _err(records, part, who):
  found = [r for r in records if r.get("part") == part and r.get("who") == who and "error" in r]
  return found[-1]["error"][:500] if found else None


def _pick(record, *keys):
  return {k: record.get(k) for k in keys} if record else None


def junit_counts(path) -> dict | None:
  if not os.path.exists(path):
    return None
  import xml.etree.ElementTree as ET
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as error:
    return {"error": str(error)}
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  return {key: sum(int(s.get(key, 0)) for s in suites)
          for key in ("tests", "failures", "errors", "skipped")}


def summarize(out_dir: str, status_path: str | None, budget: float | None) -> dict:
  """--summarize OUT: summary.json from the check's status table and bench.jsonl."""
  steps = []
  if status_path and os.path.exists(status_path):
    for line in open(status_path, encoding="utf-8"):
      fields = line.rstrip("\n").split("\t")
      if len(fields) >= 5:
        name, status, rc, seconds, cap = fields[:5]
        steps.append({"name": name, "status": status, "rc": rc,
                      "seconds": float(seconds) if seconds.replace(".", "").isdigit() else None,
                      "cap_s": cap, "note": fields[5] if len(fields) > 5 else ""})
  every_record = read_jsonl(os.path.join(out_dir, "bench.jsonl"))
  headline, targets = {}, {}
  ab_head, ab_targets = gpu_summary_ab.ab_headline(every_record)
  if ab_head:  # `run env ab` (its own figures; the rest below reads the other steps)
    headline["ab"], targets = ab_head, dict(ab_targets)
  records = [r for r in every_record if r.get("step") not in gpu_summary_ab.AB_STEPS]
  g1 = {who: _ok(records, "g1", who) for who in ("ours", "torch", "torch_compile")}
  if any(g1.values()):
    headline["g1"] = {who: _pick(r, "median_s", "tokens_per_s", "mfu", "first_step_s", "peak_gib")
                      for who, r in g1.items()}
    if g1["ours"]:
      targets["g1_mfu_ge_45pct"] = g1["ours"]["mfu"] >= 0.45
      if g1["torch_compile"]:
        speed = g1["torch_compile"]["median_s"] / g1["ours"]["median_s"]
        headline["g1"]["ours_speed_over_torch_compile"] = speed
        targets["g1_ahead_of_torch_compile"] = speed > 1.0
  g1b = _ok(records, "g1b", "ours")
  g1b_error = _err(records, "g1b", "ours")
  if g1b or g1b_error:
    headline["g1b"] = {"fits": g1b is not None, "error": None if g1b else g1b_error,
                       **(_pick(g1b, "median_s", "mfu", "peak_gib") or {})}
    targets["g1b_32x1024_fits"] = g1b is not None
  cold = _ok(records, "g2", "ours", lambda r: "median_s" in r)
  warm = _ok(records, "g2", "ours",  # gpu_check.sh's g2_warm: a new process, first call only
             lambda r: r.get("reps") == 0 and r.get("compile_cache_entries_at_start", 0) > 0)
  g2_peers = {who: _ok(records, "g2", who) for who in ("torch", "torch_compile")}
  if cold or warm or any(g2_peers.values()):
    headline["g2"] = {"ours": _pick(cold, "tokens_per_s", "frac_roofline", "first_s"),
                      "ours_first_s_warm_cache": warm and warm["first_s"],
                      **{who: _pick(r, "tokens_per_s", "frac_roofline", "first_s")
                         for who, r in g2_peers.items()}}
    if cold:
      targets["g2_roofline_ge_50pct"] = cold["frac_roofline"] >= 0.5
      if g2_peers["torch_compile"]:
        headline["g2"]["ours_over_static_cache"] = (cold["tokens_per_s"]
                                                    / g2_peers["torch_compile"]["tokens_per_s"])
    if warm:
      targets["g2_first_call_warm_cache_le_15s"] = warm["first_s"] <= 15.0
  g3 = _ok(records, "g3", "ours", lambda r: "median_s" in r)
  if g3:
    headline["g3"] = _pick(g3, "tokens_per_s", "frac_roofline", "first_s")
  g4 = [r for r in records if r.get("part") == "g4"]
  if g4:
    headline["g4"] = [{"batch": r.get("batch"), "logprob_chunk": r.get("logprob_chunk"),
                       **({"error": r["error"][:200]} if "error" in r else
                          (r.get("memory_analysis") or {}))} for r in g4]
  mismatch = [r for r in records if r.get("part") == "mismatch"]
  if mismatch:
    headline["mismatch"] = {r.get("sampler_dtype"): r.get("error") or {
        k: (r.get(k) or {}).get("median") for k in ("logprob_mismatch_mean",
                                                    "logprob_mismatch_max")} for r in mismatch}
  w3 = {who: _ok(records, "w3", who) for who in ("ours", "trl")}
  if any(w3.values()) or _err(records, "w3", "ours") or _err(records, "w3", "trl"):
    headline["w3"] = {who: (_pick(r, "s_per_step_median", "warmup_s") if r
                            else {"error": _err(records, "w3", who)}) for who, r in w3.items()}
    if w3["ours"] and w3["trl"]:
      headline["w3"]["trl_over_ours"] = (w3["trl"]["s_per_step_median"]
                                         / w3["ours"]["s_per_step_median"])
  tests = junit_counts(os.path.join(out_dir, "junit.xml"))
  if tests:
    headline["tests_fast"] = tests
  summary = {"budget_s": budget, "elapsed_s": sum(s["seconds"] or 0 for s in steps),
             "steps": steps, "headline": headline, "targets": targets,
             "errors": [{"part": r.get("part"), "who": r.get("who"), "oom": r.get("oom"),
                         "error": str(r["error"])[:300]} for r in every_record if "error" in r]}
  path = os.path.join(out_dir, "summary.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(_finite(summary), f, indent=1)
  os.replace(path + ".tmp", path)
  return summary
