"""Step metrics: reduced from device once per step, written to metrics.jsonl and the
loggers of `train.loggers` (TensorBoard, W&B, MLflow), and shown as a tqdm progress bar
(on a terminal; one plain line per step elsewhere) after a start-up summary of the run;
and samples of what was trained on, written to rollouts.jsonl (`train.log_rollouts` = N per
step; analysis/rollouts.py reads them) and given to the loggers as a table.

rollouts.jsonl has one JSON line per sample:
    step       the training step it was trained in (metrics.jsonl's `step`)
    reward     its score
    token_ids  the whole sequence the trainer trains on, prompt included, without padding
    loss_mask  same length, 1 where the token is trained on (0 on the prompt and on the
               environment's tokens of a multi-turn episode)
    turns      in order, {"role": "assistant" | "environment", "text", "token_ids"}; a
               single-turn run has one assistant turn, the response
    failure    (modes whose rows are whole samples) "" or why its reward failed, e.g.
               "reward.function f: raised ZeroDivisionError: division by zero"
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.loggers import Logger
from rlhf_jax.rollout import Rollouts
from rlhf_jax.rollout import modes as rollout_modes

# Per-mini-batch metrics reduced by their extreme, not their mean.
_EXTREMES = {"is_ratio_max": np.max, "is_ratio_min": np.min, "logprob_mismatch_max": np.max,
             "update_logprob_gap_max": np.max, "moe/load_imbalance_max": np.max}


# Metrics every role's update reports; a role's prefix tells them apart.
_GENERIC = ("loss", "grad_norm", "skipped")


def reduce_updates(metrics: Mapping[str, np.ndarray], prefix: str = "") -> dict[str, float]:
  """Per-mini-batch metrics ([E·M] host arrays) → one number each, over the mini-batches
  that were applied (`applied`); nothing when none was (e.g. a T-PPO critic step
  without a finished response). `skipped` is the fraction of non-finite updates. The
  generic names (loss, grad_norm, skipped) get `prefix`; loss terms keep their own."""
  name = lambda key: f"{prefix}{key}" if key in _GENERIC else key
  applied = np.asarray(metrics["applied"], bool)
  out = {name("skipped"): float(np.mean(metrics["skipped"]))}
  if not applied.any():
    return out
  for key, values in metrics.items():
    if key in ("applied", "skipped"):
      continue
    values = np.asarray(values)[applied]
    out[name(key)] = float(_EXTREMES.get(key, np.mean)(values))
  return out


def process_reward_metrics(batch) -> dict[str, float]:
  """A PRM's raw step scores in the batch (none without step rewards): their mean, the
  mean score of each response's last step (the PRM's own verdict on the whole response,
  to set beside the verifier's accuracy), and steps per response."""
  mask = np.asarray(batch.step_mask) > 0
  if not mask.any():
    return {}
  scores = np.asarray(batch.step_rewards)
  rows = mask.any(axis=1)
  last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
  return {"process/step_score_mean": float(scores[mask].mean()),
          "process/last_step_score_mean": float(scores[rows, last[rows]].mean()),
          "process/steps_per_response": float(mask.sum(axis=1)[rows].mean())}


def rollout_metrics(rollouts: Rollouts, prepared: Mapping[str, np.ndarray]) -> dict[str, float]:
  """Scores, lengths and accuracy of the finished responses (all rows except T-PPO's
  unfinished ones; none of these keys when nothing finished), plus the metrics from
  `prepare`: the rollout correction's and the sampler–trainer mismatch over fresh
  tokens (sampled by the policy being trained), `staleness/*` over the stale ones
  (decoupled PPO), the KL controller's."""
  batch = rollouts.batch
  finished = np.asarray(batch.finished, bool)
  scores = np.asarray(prepared.pop("scores"))[finished]
  lengths = np.asarray(batch.lengths)[finished]
  out = {k: float(v) for k, v in prepared.items()}
  if lengths.size:
    out.update(reward_mean=float(scores.mean()), reward_std=float(scores.std()),
               accuracy=float(np.mean(rollouts.correct)),
               response_length_mean=float(lengths.mean()),
               response_length_max=float(lengths.max()),
               truncation_rate=float(np.asarray(batch.truncated)[finished].mean()))
    correct = np.asarray(rollouts.correct, bool)
    for verdict, rows in (("correct", correct), ("wrong", ~correct)):
      if rows.any():  # DAPO §3.3 watches the length of the wrong ones
        out[f"response_length_{verdict}_mean"] = float(lengths[rows].mean())
  out["reward_failures"] = float(len(rollouts.failures))
  out.update(process_reward_metrics(batch))
  out.update(rollouts.metrics)
  return out


class MetricsWriter:
  """Appends one JSON line per record to <workdir>/metrics.jsonl and gives its numbers to
  the `loggers` (training/loggers.py: TensorBoard, W&B, MLflow). With `enabled` False
  (every process of a job but the first) it writes nothing."""

  def __init__(self, workdir: str, loggers: Sequence[Logger] = (), *, enabled: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.loggers = list(loggers)
    self.enabled = enabled

  def write(self, record: dict[str, Any]) -> None:
    """Appends `record` (it must have a `step`)."""
    if not self.enabled:
      return
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    numbers = {key: float(value) for key, value in record.items()
               if key != "step" and isinstance(value, (int, float))}
    for logger in self.loggers:
      logger.log_metrics(record["step"], numbers)

  def truncate_after(self, step: int, log: Callable[[str], None] = print) -> None:
    """Drops records after `step` (a resumed run writes them again); `truncate_jsonl`."""
    if self.enabled:
      truncate_jsonl(self.path, step, log)

  def close(self, failed: bool = False) -> None:
    """Finishes the loggers' runs (`failed`: the run raised)."""
    for logger in self.loggers:
      logger.close(failed)
    self.loggers = []


def summary_line(m: Mapping[str, float]) -> str:
  """The step's key metrics for the progress bar's postfix."""
  parts = []
  if "reward_mean" in m:
    parts += [f"reward {m['reward_mean']:+.3f}", f"acc {m['accuracy']:.3f}",
              f"len {m['response_length_mean']:.1f}"]
  for key, label, fmt in (("finished_responses", "done", ".0f"), ("entropy", "ent", ".3f"),
                          ("kept_groups_ratio", "kept", ".2f"), ("value_loss", "vloss", ".4f"),
                          ("logprob_mismatch_max", "mismatch", ".1e"),
                          ("staleness/stale_token_fraction", "stale", ".2f"),
                          ("fleet/live_servers", "servers", ".0f"),
                          ("fleet/server_deaths", "deaths", ".0f"),
                          ("fleet/resent_requests", "resent", ".0f"),
                          ("eval_accuracy", "EVAL", ".3f")):
    if key in m:
      parts.append(f"{label} {m[key]:{fmt}}")
  return " | ".join(parts)


def startup_lines(c, model_config, mesh, train_examples: Sequence[Any],
                  held_out: Sequence[Any], step: int) -> list[str]:
  """What a run is, said once before it starts (`Trainer.run`): the policy's family,
  parameter count and dtypes (`model_config`, a DecoderConfig); the devices and the
  `mesh`; the rows read from each data file (or generated); the batch (prompts x group
  size) and the tokens a step holds at most (prompt + the mode's response columns)."""
  devices = jax.devices()
  axes = " x ".join(f"{axis} {size}" for axis, size in mesh.shape.items())
  rows = []
  for field, examples in (("train_file", train_examples), ("eval_file", held_out)):
    source = c.data[field] or (f"generated {c.data.task} problems" if examples else "")
    if source:
      rows.append(f"{len(examples)} {field.split('_')[0]} rows from {source}")
  samples = c.rollout.prompts_per_step * c.rollout.group_size
  response = rollout_modes.response_length(c)
  return [
      f"policy: {model_config.architecture}, {model_config.num_params() / 1e6:.2f}M "
      f"parameters, {model_config.param_dtype} parameters, {model_config.dtype} compute",
      f"devices: {len(devices)} x {devices[0].platform} ({devices[0].device_kind}); "
      f"mesh {axes}",
      "data: " + ("; ".join(rows) or "none read (offline groups)"),
      f"batch: {c.rollout.prompts_per_step} prompts x {c.rollout.group_size} samples = "
      f"{samples} responses per step; up to {samples * (c.data.prompt_length + response):,} "
      f"tokens per step (prompt {c.data.prompt_length} + response {response} each); "
      f"{c.train.steps - step} steps to go",
  ]


class Progress:
  """A tqdm bar over training steps (to the log's stream), one postfix per step."""

  def __init__(self, total: int, initial: int, *, file=None, disable: bool = False):
    from tqdm import tqdm
    self.bar = tqdm(total=total, initial=initial, unit="step", file=file, disable=disable,
                    dynamic_ncols=True, mininterval=0)

  def update(self, metrics: Mapping[str, float]) -> None:
    """Advances one step and shows its metrics."""
    self.bar.set_postfix_str(summary_line(metrics), refresh=False)
    self.bar.update(1)

  def close(self) -> None:
    self.bar.close()


def rollout_records(step: int, rollouts, tokenizer, count: int) -> list[dict[str, Any]]:
  """Up to `count` rows of `rollouts` (spread evenly over the batch, so over its groups)
  as rollouts.jsonl records."""
  batch = rollouts.batch
  total = int(np.shape(batch.lengths)[0])
  rows = sorted(set(np.linspace(0, total - 1, min(count, total)).round().astype(int).tolist()))
  prompt_width = int(np.shape(batch.tokens)[1]) - int(np.shape(batch.response_mask)[1])
  out = []
  for row in rows:
    tokens = np.asarray(batch.tokens[row])
    attention = np.asarray(batch.attention_mask[row]).astype(bool)
    n = int(batch.lengths[row])
    prompt = tokens[:prompt_width][attention[:prompt_width]].tolist()
    response = tokens[prompt_width:prompt_width + n].tolist()
    mask = np.asarray(batch.response_mask[row][:n]).astype(int).tolist()
    turns = (rollouts.transcripts[row] if rollouts.transcripts is not None else
             [{"role": "assistant", "text": tokenizer.decode(response), "token_ids": response}])
    record = {"step": step, "reward": float(batch.scores[row]),
              "token_ids": prompt + response, "loss_mask": [0] * len(prompt) + mask,
              "turns": turns}
    if rollouts.row_failures is not None:
      record["failure"] = rollouts.row_failures[row]
    out.append(record)
  return out


def rollout_row(record: Mapping[str, Any], tokenizer) -> dict[str, Any]:
  """A rollouts.jsonl record as the loggers' table row: step, reward, and the prompt and
  response as text (the response: every turn's text, in order)."""
  response = sum(len(turn["token_ids"]) for turn in record["turns"])
  prompt = record["token_ids"][:max(len(record["token_ids"]) - response, 0)]
  return {"step": record["step"], "reward": record["reward"],
          "prompt": tokenizer.decode(prompt),
          "response": "".join(turn["text"] for turn in record["turns"])}


class RolloutLog:
  """Appends `count` samples per step to <workdir>/rollouts.jsonl and gives them to the
  `loggers` as rows of text (nothing with count 0 or `enabled` False: every process of a
  job but the first)."""

  def __init__(self, workdir: str, count: int, tokenizer, loggers: Sequence[Logger] = (), *,
               enabled: bool = True):
    self.path = os.path.join(workdir, "rollouts.jsonl")
    self.count = count
    self.tokenizer = tokenizer
    self.loggers = list(loggers)
    self.enabled = enabled and count > 0

  def write(self, step: int, rollouts) -> None:
    """Appends the step's samples."""
    if not self.enabled:
      return
    records = rollout_records(step, rollouts, self.tokenizer, self.count)
    with open(self.path, "a", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")
    if self.loggers:
      rows = [rollout_row(record, self.tokenizer) for record in records]
      for logger in self.loggers:
        logger.log_rollouts(step, rows)

  def truncate_after(self, step: int, log: Callable[[str], None] = print) -> None:
    """Drops the samples of steps after `step` (a resumed run writes them again);
    `truncate_jsonl`."""
    if self.enabled:
      truncate_jsonl(self.path, step, log)


def truncate_jsonl(path: str, step: int, log: Callable[[str], None] = print) -> None:
  """Drops the lines of a JSON-lines file whose `step` is after `step` (no file: nothing).

  The file is replaced at once (a crash leaves the old one). A torn last line (a crash
  mid-write: cut JSON, or cut inside a multi-byte character) is dropped with a warning to
  `log` naming the file; a malformed line before it (not JSON, or not UTF-8 text) is a
  ConfigError naming the file and line (the records were edited or damaged: resuming over
  them would hide it)."""
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:  # decoded line by line: bad bytes are one line's fault
    lines = f.read().split(b"\n")
  if lines and not lines[-1]:
    lines.pop()  # the newline that ends the last record
  kept = []
  for number, line in enumerate(lines, 1):
    try:
      line = line.decode("utf-8")
      record = json.loads(line)
      record_step = record["step"] if isinstance(record, dict) else None
      if not isinstance(record_step, int):
        raise ValueError("no integer 'step'")
    except (ValueError, KeyError, RecursionError) as error:
      if number < len(lines):
        raise ConfigError(f"{path}: line {number} is not a record with a step ({error}); "
                          "fix or remove the line to resume") from None
      log(f"warning: {path}: dropped its torn last line {number} ({len(line)} characters; "
          "the run stopped while writing it)")
      continue
    if record_step <= step:
      kept.append(line + "\n")  # a last line without its newline gets one
  # A new file beside it, then renamed over it: a crash mid-write leaves the old records.
  fd, temp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                              dir=os.path.dirname(os.path.abspath(path)))
  try:
    with open(fd, "w", encoding="utf-8") as f:
      f.writelines(kept)
      f.flush()
      os.fsync(f.fileno())
    shutil.copymode(path, temp)
    os.replace(temp, path)
  except BaseException:
    os.unlink(temp)
    raise
