"""Markdown tables of scripts/reproduce/offline_methods.sh's runs (argument: its output
directory): held-out accuracy of each training arm, Best-of-N against speculative
rejection, Q♯ against π_ref and Best-of-N."""

import json
import os
import sys

ARMS = ("dpo", "dpo_lr1e-4", "iterative_dpo", "dqo", "dqo_lr2e-4", "ppo", "grpo")


def records(path):
  if not os.path.exists(path):
    return []
  return [json.loads(line) for line in open(path, encoding="utf-8") if line.startswith("{")]


def training_table(root):
  rows = ["| method | steps | held-out greedy accuracy: start → best (step) → end | seconds |",
          "| --- | --- | --- | --- |"]
  for arm in ARMS:
    metrics = records(os.path.join(root, arm, "metrics.jsonl"))
    evals = [(m["step"], m["eval_accuracy"]) for m in metrics if "eval_accuracy" in m]
    if not evals:
      continue
    best = max(evals, key=lambda e: e[1])
    seconds = max((m.get("elapsed_s", 0.0) for m in metrics), default=0.0)
    rows.append(f"| {arm} | {evals[-1][0]} | {100 * evals[0][1]:.1f}% → {100 * best[1]:.1f}% "
                f"({best[0]}) → {100 * evals[-1][1]:.1f}% | {seconds:.0f} |")
  return "\n".join(rows)


def search_table(path, title):
  lines = records(path)
  if not lines:
    return ""
  rows = [f"{title}\n", "| method | N | decisions (tokens) | reward of the pick | verifier "
          "accuracy of the pick | generated tokens | seconds (scoring) |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in lines:
    rows.append(f"| {r['method']} | {r['n']} | {','.join(map(str, r['decision_tokens'])) or '-'}"
                f" | {r['reward_mean']:.3f} | {100 * r['accuracy']:.1f}% | "
                f"{r['generated_tokens']} | {r['seconds']:.1f} ({r['scoring_seconds']:.1f}) |")
  return "\n".join(rows)


def qsharp_table(path):
  lines = records(path)
  if not lines:
    return ""
  rows = ["| policy | round | held-out accuracy (T=1) | KL to π_ref (nats/response) |",
          "| --- | --- | --- | --- |"]
  for r in lines:
    kl = (f"{r['kl_to_ref']:.3f}" if "kl_to_ref" in r else
          f"≤ {r['kl_to_ref_bound']:.3f} (bound)")
    round_ = "-" if r.get("round") is None else r["round"]
    rows.append(f"| {r['policy']} | {round_} | {100 * r['accuracy']:.1f}% | {kl} |")
  return "\n".join(rows)


def main(root):
  print("# Offline and inference-time methods on arith (seed-0 warm start)\n")
  print("Written by `bash scripts/reproduce/offline_methods.sh`.\n")
  print(training_table(root) + "\n")
  for name, title in (("bon_rm.jsonl", "Best-of-N vs speculative rejection, BT reward model "
                       "(128 held-out prompts):"),
                      ("bon_prm.jsonl", "The same with the PRM's value of the last token:")):
    table = search_table(os.path.join(root, name), title)
    if table:
      print(table + "\n")
  table = qsharp_table(os.path.join(root, "qsharp.jsonl"))
  if table:
    print("Q♯ (256 held-out prompts × 4 samples at T = 1):\n\n" + table)


if __name__ == "__main__":
  main(sys.argv[1])
