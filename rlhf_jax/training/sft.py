"""Supervised fine-tuning on (prompt, solution) pairs: the warm start before RL.

The batch layout is the rollout layout (prompt left-padded to P, solution +
EOS right-padded to R), so SFT reuses `response_logprobs`: the loss is the
token-mean negative log-likelihood of the solution tokens.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Callable, Sequence

import jax
import numpy as np
import optax

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.algorithms.rollout import encode_pairs
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import pycalc


@dataclasses.dataclass
class SFTResult:
  """What `run_sft` returns: final params and the loss curve."""
  params: dict
  losses: list[float]
  seconds: float


def sft_loss(model, params, batch: rollout_lib.RolloutBatch) -> jax.Array:
  """Token-mean negative log-likelihood of the response tokens."""
  logprobs = rollout_lib.response_logprobs(model, params, batch)
  return -kernels.aggregate(logprobs, batch.response_mask, mode="token-mean")


def fit(loss_fn: Callable, params, make_batch: Callable[[int], object], *, steps: int,
        learning_rate: float, warmup_steps: int = 20, weight_decay: float = 0.0,
        max_grad_norm: float = 1.0,
        progress: Callable[[int, float], None] | None = None) -> SFTResult:
  """Minimises `loss_fn(params, batch)` for `steps` steps on `make_batch(step)` batches
  (any pytree of arrays) with AdamW, linear warmup and a cosine decay to 10 %: the
  supervised loop of SFT, reward models, PRMs and judges."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup_steps, 1),
                                                max(steps, warmup_steps + 1),
                                                end_value=learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(max_grad_norm),
                          optax.adamw(schedule, weight_decay=weight_decay))

  @jax.jit
  def step_fn(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  losses = []
  start = time.perf_counter()
  for step in range(steps):
    batch = jax.tree.map(jax.numpy.asarray, make_batch(step))
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses.append(float(loss))
    if progress is not None:
      progress(step, losses[-1])
  return SFTResult(params=params, losses=losses, seconds=time.perf_counter() - start)


def run_sft(model, params, make_batch: Callable[[int], rollout_lib.RolloutBatch], *,
            steps: int, learning_rate: float, **options) -> SFTResult:
  """Trains the LM on `make_batch(step)` batches of (prompt, response) rows (`fit` of
  `sft_loss`; options: warmup_steps, weight_decay, max_grad_norm, progress)."""
  return fit(lambda p, batch: sft_loss(model, p, batch), params, make_batch, steps=steps,
             learning_rate=learning_rate, **options)


def sft_arith_batches(tokenizer, *, seed: int, batch_size: int, levels, weights,
                      prompt_prefix: Sequence[int], prompt_length: int, response_length: int,
                      direct_fraction: float = 0.0, slip_rate: float = 0.0,
                      task: str = arith.TASK):
  """`make_batch(step)` for run_sft: fresh arith problems every step (never the eval set's
  seeds, which the caller keeps apart).

  A `direct_fraction` of the demonstrations give only the answer line
  (`Problem.direct_solution`) instead of the worked digit-serial solution: a
  demonstrator that is always right, but in a form the tiny student cannot imitate
  reliably. Which form to use is then the student's choice, and RL's to correct.
  A `slip_rate` makes the worked demonstrations those of a careless teacher who drops
  each incoming carry or borrow with that probability (`arith.slipped_solution`).
  For the `pycalc` task the demonstration is the program (`tasks/pycalc.program`).
  """
  def make_batch(step):
    problems = list(arith.generate(seed * 1_000_003 + step, batch_size, levels, weights))
    rng = np.random.default_rng([seed, step])
    direct = rng.random(batch_size) < direct_fraction
    if task == pycalc.TASK:
      solutions = [pycalc.program(p) for p in problems]
    else:
      solutions = [p.direct_solution if d else arith.slipped_solution(p, rng, slip_rate)
                   for p, d in zip(problems, direct)]
    return encode_pairs(tokenizer, [p.prompt for p in problems], solutions,
                        prompt_prefix=prompt_prefix, prompt_length=prompt_length,
                        response_length=response_length)

  return make_batch


def policy_checkpoint_dir(c, workdir: str) -> str:
  """Where a run's initial policy lives: `model.checkpoint`, or <workdir>/sft (arith)."""
  return c.model.checkpoint or os.path.join(workdir, "sft")


def ensure_arith_warm_start(c, workdir: str, log: Callable[[str], None] = print) -> str:
  """The arith warm start: trains and saves `policy_checkpoint_dir` unless it exists
  (a 3-layer decoder and the character tokenizer, created locally). Returns the directory."""
  directory = policy_checkpoint_dir(c, workdir)
  if os.path.exists(os.path.join(directory, "config.json")):
    log(f"SFT warm start: {directory} (delete it to train a new one)")
    return directory
  log(f"no SFT checkpoint in {directory}: training the arith warm start from scratch "
      f"({c.sft.steps} steps)")
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=c.model.hidden_size,
      num_layers=c.model.num_layers, num_heads=c.model.num_heads,
      max_positions=c.sampler.cache_length), seed=c.seed)
  prefix = [tokenizer.backend.token_to_id(token) for token in arith.PROMPT_PREFIX]
  make_batch = sft_arith_batches(
      tokenizer, seed=c.seed + 17, batch_size=c.sft.batch_size, levels=tuple(c.sft.levels),
      weights=tuple(c.sft.level_weights), prompt_prefix=prefix,
      prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
      direct_fraction=c.sft.direct_fraction, slip_rate=c.sft.carry_slip, task=c.data.task)
  from tqdm import tqdm
  bar = tqdm(total=c.sft.steps, desc="SFT warm start", unit="step", dynamic_ncols=True)

  def progress(step, loss):
    bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.update(1)

  try:
    result = run_sft(model, params, make_batch, steps=c.sft.steps,
                     learning_rate=c.sft.learning_rate, progress=progress)
  finally:
    bar.close()
  # Written aside and renamed, so an interrupted save never looks like a checkpoint.
  partial = directory.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  models.save_policy(partial, model, result.params, tokenizer, list(arith.PROMPT_PREFIX))
  if os.path.exists(directory):  # a leftover without config.json
    shutil.rmtree(directory)
  os.replace(partial, directory)
  log(f"SFT warm start saved to {directory} (final loss {result.losses[-1]:.4f}, "
      f"{result.seconds:.0f} s)")
  return directory
