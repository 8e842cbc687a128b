"""The RL loop: prompts → sampler → scorer → prepare → updates → new weights to the sampler.

    rollouts = rollout.collect()              host: sample (any Sampler), score (any Scorer)
    batch    = on_mesh(rollouts.batch)        rows split over (data, fsdp, expert)
    out      = learner.learn(batch, step)     device: one jitted prepare, donated updates
    sampler.update_params(policy)             the next rollout samples the new policy
    metrics  = device_get(out)                the step's only host sync

Everything algorithm-specific lives behind two seams: the `Learner` of
`algorithm.learner` (algorithms/learner.py; it also decides when the actor updates)
and the `Rollout` of the rollout mode (rollout/modes.py; it owns the data position and
the curriculum phase). The reward is decided in rewards/build.py. The loop is the
same for every preset.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.config_errors import unfit
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rewards.scorer import FailureStreak
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.rollout.lookahead import LookAhead
from rlhf_jax.sampling import protocol as sampler_protocol
from rlhf_jax.training import build
from rlhf_jax.training import inputs
from rlhf_jax.training import metrics as metrics_lib
from rlhf_jax.training import checkpoint as checkpoint_lib
from rlhf_jax.training import loggers as loggers_lib
from rlhf_jax.training import run_control
from rlhf_jax.training.checkpoint import Checkpointer
from rlhf_jax.training.config import validate_config


class Trainer:
  """Runs one RL training job.

  Args:
    config: the trainer config (validated here; rlhf_jax.training.config).
    workdir: checkpoints, metrics.jsonl, the loggers' files (TensorBoard events, W&B's
      offline files, MLflow's store unless MLFLOW_TRACKING_URI) and the final policy.
      The initial policy is `model.checkpoint`, or <workdir>/sft for a built-in
      task's run (`stages.prepare_run` trains it; the launcher calls it).
    log: where status lines go.
    scorer: the reward (default: the rule-based router of the `reward` section).
    progress: show a tqdm bar (launchers; off in tests).
    lock: the workdir's lock when the caller took it already (a launcher, before the warm
      start); the trainer holds it from here and releases it when it ends.
  """

  def __init__(self, config, workdir: str, *, log: Callable[[str], None] = print,
               scorer: Scorer | None = None, progress: bool = False,
               lock: run_control.WorkdirLock | None = None):
    validate_config(config, num_devices=jax.device_count())
    build.check_deterministic(config)
    self.config = config
    # In a job of several processes (parallel/distributed.py) the first one speaks and
    # writes files; every process computes the same step.
    main = parallel.is_main_process()
    # A bar redrawn with carriage returns is one unreadable line in a log file or a pipe:
    # there the loop logs one plain line per step instead (train.log_every).
    self.workdir, self.show_progress = workdir, progress and main and loggers_lib.on_terminal()
    self.log = log if main else (lambda line: None)
    # One trainer per workdir, before any work: a second one would interleave records.
    self.lock = lock or run_control.WorkdirLock(workdir)
    if main:
      self.lock.acquire()
    try:
      self._build(config, workdir, scorer, main)
    except BaseException:
      self.lock.release()
      raise

  def _build(self, c, workdir: str, scorer: Scorer | None, main: bool) -> None:
    os.makedirs(workdir, exist_ok=True)
    self.mesh = build.trainer_mesh(c)
    self.policy = build.load_policy(c, workdir, self.mesh)
    self.train_examples, self.held_out = inputs.load_examples(c, self.policy.prompts,
                                                                 scorer=scorer)
    tasks = sorted({e.task for e in self.train_examples + self.held_out})
    self.scorer = (scorer if scorer is not None else
                   reward_build.training_scorer(c, tasks, self.mesh,
                                                 self.policy.prompts))
    # Held-out accuracy is the rule verifiers' (the true one) whatever the reward is.
    self.eval_scorer = (self.scorer if scorer is not None else reward_build.evaluation_scorer(
        c, self.scorer, sorted({e.task for e in self.held_out})))
    if not rollout_modes.rewarded_by_environment(c):  # else no task is scored
      self.scorer.check_tasks([e.task for e in self.train_examples + self.held_out])
    try:
      self.sampler = build.build_sampler(c, self.policy, self.mesh)
    except sampler_protocol.SamplerUnavailable as error:
      unfit("sampler.addresses", run_control.one_line(error))
    self.fleet = sampler_protocol.find_extra(self.sampler, sampler_protocol.ServerFleet)
    self.synchronous = LookAhead.of(c).synchronous  # each batch sampled by the newest weights
    # The mode's rollout and its evaluator share the parts (generator, environment workers).
    parts = build.rollout_parts(c, self.policy, self.sampler, self.scorer, self.train_examples,
                                workdir=workdir, log=self.log)
    self.rollout = build.build_rollout(c, parts)
    self.evaluator = build.build_evaluator(c, parts, self.held_out, self.eval_scorer)
    self.learner = build.build_learner(c, self.policy, self.mesh)
    # The policy's weights in the sampler's layout (decided once: build.sampler_layout).
    self.to_sampler = build.sampler_layout(c, self.policy.model, self.learner.policy_params,
                                           self.mesh)
    # The last step whose records are all written, the last one saved, and (fleet runs)
    # the rollout's state when the step in progress began: what a checkpoint needs.
    self.step = self.recorded_step = 0
    self.saved_step: int | None = None
    self.step_start: tuple[int, dict[str, Any]] | None = None
    loggers = loggers_lib.build_loggers(c, workdir, enabled=main)  # W&B, MLflow runs start
    self.metrics = metrics_lib.MetricsWriter(workdir, loggers, enabled=main)
    self.rollout_log = metrics_lib.RolloutLog(workdir, c.train.log_rollouts,
                                              self.policy.tokenizer, loggers, enabled=main)
    self.checkpointer = Checkpointer(workdir)
    self.reward_failures = FailureStreak(c.reward.max_failed_steps)
    try:
      restored = self.checkpointer.restore_intact(self.learner.state(), log=self.log)
      if restored is not None:
        self._resume(*restored)
      else:  # a run that died before its first checkpoint starts over: so do its records
        self.metrics.truncate_after(-1, self.log)
        self.rollout_log.truncate_after(-1, self.log)
    except BaseException:
      self.metrics.close(failed=True)  # the loggers' runs end, marked failed
      raise
    for line in metrics_lib.startup_lines(c, self.policy.model.config, self.mesh,
                                          self.train_examples, self.held_out, self.step):
      self.log(line)  # what the run is, once, before anything compiles

  # ------------------------------------------------------------------ one step

  def train_step(self) -> dict[str, float]:
    """One rollout batch → updates → new weights in the sampler; returns the step's metrics."""
    start = time.perf_counter()
    self.rollout.set_step(self.step)  # a curriculum's phase
    rollouts = self.rollout.collect()
    stop = self.reward_failures.update(len(rollouts.correct), rollouts.failures)
    if stop:  # before this step trains on failure scores
      self.log(f"stopped before step {self.step + 1}: {stop}; "
               f"{run_control.last_checkpoint(self.checkpointer)}")
      raise run_control.Stopped(1)
    generated = time.perf_counter()
    batch = jax.tree.map(
        lambda x: jax.device_put(x, parallel.batch_sharding(self.mesh, np.ndim(x))),
        rollouts.batch)
    with parallel.expert_parallel_context(self.mesh):  # MoE layers: expert parallelism
      out = self.learner.learn(batch, self.step)
    self.step += 1
    self.rollout_log.write(self.step, rollouts)
    self.push_weights()
    out = parallel.host_values(out)  # the step's one read of device values
    updated = time.perf_counter()
    metrics = metrics_lib.rollout_metrics(rollouts, out["prepare"])
    metrics.update({f"data/task_mix/{task}": float(n)
                    for task, n in self.rollout.pop_mix().items()})
    if "actor" in out:
      metrics.update(metrics_lib.reduce_updates(out["actor"]))
    if "critic" in out:
      metrics.update(metrics_lib.reduce_updates(out["critic"], prefix="critic_"))
    metrics.update(out.get("learner", {}))  # the learner's own figures (packing)
    metrics["sampler/push_bytes"] = float(self.push_bytes)
    if self.fleet is not None:  # live servers, deaths, joins, re-sent requests
      metrics.update(self.fleet.metrics())
    batch = rollouts.batch
    new_tokens = int(np.sum(np.asarray(batch.lengths) - np.asarray(batch.window_starts)))
    metrics.update(step=self.step, actor_updated=float("actor" in out),
                   time_generate=generated - start, time_update=updated - generated,
                   tokens_per_second=new_tokens / max(generated - start, 1e-9))
    return metrics

  def push_weights(self, *, rollback: bool = False) -> None:
    """The sampler gets the current policy (in its layout), tagged with the step.
    `rollback` (after a restore): a sampling server that kept running may hold a newer
    version than the checkpoint's step (the run went on past it); this run owns the
    server's version, so the older one is sent on purpose."""
    params = self.to_sampler(self.learner.policy_params)
    # A VersionedSampler is no RollsBack: it stores the version itself (and rolls the
    # sampler it wraps back when a job needs the older one).
    if rollback and isinstance(self.sampler, sampler_protocol.RollsBack):
      self.sampler.rollback_params(params, version=self.step)
    else:
      self.sampler.update_params(params, version=self.step)
    self.push_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))

  # ------------------------------------------------------------------ evaluation

  def evaluate(self) -> dict[str, float]:
    """Held-out accuracy with the current weights: greedy ("eval_accuracy") and, with
    `train.eval_samples` > 0, sampled at the rollout temperature ("eval_sampled_accuracy",
    "eval_pass@k"); both also per level or task ("eval_accuracy/L2")."""
    if not self.held_out:
      return {}
    self.rollout.settle()  # generation running ahead finishes first: one user of the sampler
    c = self.config
    greedy = self.evaluator(samples=1, temperature=0.0)
    out = {f"eval_{k}": v for k, v in greedy.items() if k.startswith("accuracy")}
    out["eval_response_length"] = greedy["response_length"]
    # Responses the verifier found no answer in: 0 % accuracy is never left unexplained.
    for rate in ("no_answer_rate", "truncation_rate"):
      if rate in greedy:  # episodes say no no-answer rate
        out[f"eval/{rate}"] = greedy[rate]
    if "turns" in greedy:  # multi-turn episodes
      out["eval_turns"] = greedy["turns"]
    if c.train.eval_samples:
      sampled = self.evaluator(samples=c.train.eval_samples,
                               temperature=c.rollout.temperature,
                               seed=c.seed + 7919 * (self.step + 1))
      out.update({f"eval_sampled_{k}": v for k, v in sampled.items()
                  if k.startswith("accuracy")})
      out.update({f"eval_{k}": v for k, v in sampled.items() if k.startswith(("pass@", "maj@"))})
    self.eval_scorer.pop_metrics()  # the per-task counters are the training samples'
    return out

  # ------------------------------------------------------------------ checkpoints

  def save(self, rollout_state: dict[str, Any] | None = None) -> None:
    """Checkpoints every role's state, the rollout's state (data position, buffers,
    responses in flight, seeds; `rollout_state` when given, else the current one) and the
    config (see training/checkpoint.py)."""
    meta = {"step": self.step, "config": self.config.to_dict(),
            "rollout": self.rollout.state() if rollout_state is None else rollout_state}
    self.checkpointer.save(self.step, self.learner.state(), json.loads(json.dumps(meta)))
    self.saved_step = self.step

  def restore(self, step: int) -> None:
    """Continues from checkpoint `step` (and drops metrics logged after it)."""
    state, meta = self.checkpointer.restore(step, self.learner.state())
    self._resume(step, state, meta)

  def _resume(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    del step  # the meta's
    self.learner.restore(state)
    self.step = self.recorded_step = self.saved_step = int(meta["step"])
    self.rollout.restore(meta["rollout"])
    changed, _ = checkpoint_lib.config_changes(meta["config"], self.config.to_dict())
    if changed:  # the run's config is the checkpoint's but for RESUMABLE_FIELDS
      checkpoint_lib.refuse_changes(self.workdir, self.step, changed)
    self.push_weights(rollback=True)
    self.metrics.truncate_after(self.step, self.log)
    self.rollout_log.truncate_after(self.step, self.log)
    self.log(f"resumed from step {self.step}")

  # ------------------------------------------------------------------ the loop

  def run(self) -> dict[str, Any]:
    """Trains until `train.steps` with evaluation and checkpoints; returns the summary.
    The lifecycle around the loop (signals, a lost fleet, the loggers' end, the exported
    policy, the lock) is `run_control.run_to_end`'s."""
    return run_control.run_to_end(self)

  def export_policy(self) -> str:
    """Writes the current policy to <workdir>/policy (the main process), in the
    checkpoint layout `models.save_policy` writes; returns the directory."""
    policy = os.path.join(self.workdir, "policy")
    params = parallel.host_values(self.learner.policy_params)  # leaf by leaf
    if parallel.is_main_process():
      models.save_policy(policy, self.policy.model, params, self.policy.tokenizer,
                         self.policy.prefix_tokens)
    return policy

  def close(self, failed: bool = False, *, release_lock: bool = True) -> None:
    """Ends what the trainer holds (`run` does it): generation running ahead, pending
    checkpoint writes, the loggers' runs (`failed`: marked failed), the workdir's lock
    (`release_lock`; `run` keeps it until the policy is written)."""
    self.rollout.close()  # a worker thread generating ahead stops
    self.checkpointer.close()
    self.metrics.close(failed=failed)
    if release_lock:
      self.lock.release()

  def train(self, summary: dict[str, Any], start: float,
            signals: run_control.StopSignals) -> None:
    """The loop: a step, its evaluation, its records and checkpoint, until `train.steps`
    (or a stop asked for by a signal, after a step's records: `run_control`)."""
    c = self.config
    progress = metrics_lib.Progress(c.train.steps, self.step, disable=not self.show_progress)
    try:
      if self.held_out and c.train.eval_every and self.step == 0:  # 0: evaluation off
        first = self.evaluate()
        summary["eval_accuracy_start"] = first["eval_accuracy"]
        self.metrics.write({"step": self.step, **first})
        self.log(f"step {self.step}: held-out accuracy {first['eval_accuracy']:.3f}")
      first = True  # of this process: it compiles the step's programs
      while self.step < c.train.steps:
        run_control.stop_if_asked(self, signals)  # every record of `self.step` is written
        if self.fleet is not None and self.synchronous:
          # what a checkpoint of this step holds if the fleet is lost while sampling
          self.step_start = (self.step, json.loads(json.dumps(self.rollout.state())))
        metrics = self._first_step_said() if first else self.train_step()
        first = False
        if self.held_out and c.train.eval_every and (self.step % c.train.eval_every == 0
                                                     or self.step == c.train.steps):
          metrics.update(self.evaluate())
          summary["eval_accuracy_end"] = metrics["eval_accuracy"]
          self.log(f"step {self.step}: held-out accuracy {metrics['eval_accuracy']:.3f}")
        metrics["elapsed_s"] = time.perf_counter() - start
        self.metrics.write(metrics)
        self.recorded_step = self.step
        progress.update(metrics)
        if self.step % c.train.log_every == 0 and not self.show_progress:
          self.log(f"step {self.step}/{c.train.steps}: {metrics_lib.summary_line(metrics)}")
        if self.step % c.train.checkpoint_every == 0 or self.step == c.train.steps:
          self.save()
    finally:
      progress.close()

  def _first_step_said(self) -> dict[str, float]:
    """The process's first step, announced: it compiles the sampler's and the learner's
    programs (tens of seconds for a GPU-sized model), which is no hang."""
    self.log(f"step {self.step + 1}: compiling the step's programs (the first step of a "
             "process compiles them; later steps reuse them)")
    start = time.perf_counter()
    metrics = self.train_step()
    self.log(f"step {self.step}: compiled and ran in {time.perf_counter() - start:.1f} s")
    return metrics
