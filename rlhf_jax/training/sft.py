"""Supervised fine-tuning on (prompt, solution) pairs: the warm start before RL.

The batch layout is the rollout layout (prompt left-padded to P, solution +
EOS right-padded to R), so SFT reuses `response_logprobs`: the loss is the
token-mean negative log-likelihood of the solution tokens.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import optax

from rlhf_jax import kernels
from rlhf_jax.algorithms import rollout as rollout_lib


@dataclasses.dataclass
class SFTResult:
  """What `run_sft` returns: final params and the loss curve."""
  params: dict
  losses: list[float]
  seconds: float


def encode_pairs(tokenizer, prompts: Sequence[str], solutions: Sequence[str], *,
                 prompt_prefix: Sequence[int], prompt_length: int, response_length: int
                 ) -> rollout_lib.RolloutBatch:
  """Tokenizes prompt/solution pairs into a RolloutBatch (solution + EOS as the response)."""
  prompt_ids = [list(prompt_prefix) + tokenizer.encode(p) for p in prompts]
  responses = [tokenizer.encode(s) + [tokenizer.eos_id] for s in solutions]
  zeros = [[0.0] * len(r) for r in responses]
  return rollout_lib.build_rollout_batch(
      prompt_ids, responses, zeros, [0.0] * len(prompts), [False] * len(prompts),
      list(range(len(prompts))), prompt_length=prompt_length,
      response_length=response_length, pad_id=tokenizer.pad_id)


def make_sft_step(model, optimizer: optax.GradientTransformation):
  """The jitted step: (params, opt_state, batch) → (params, opt_state, loss)."""

  def loss_fn(params, batch):
    logprobs = rollout_lib.response_logprobs(model, params, batch)
    return -kernels.aggregate(logprobs, batch.response_mask, mode="token-mean")

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def run_sft(model, params, make_batch: Callable[[int], rollout_lib.RolloutBatch], *,
            steps: int, learning_rate: float, warmup_steps: int = 20,
            weight_decay: float = 0.0, max_grad_norm: float = 1.0,
            progress: Callable[[int, float], None] | None = None) -> SFTResult:
  """Trains for `steps` steps on `make_batch(step)` batches (AdamW, warmup + cosine decay)."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup_steps, 1),
                                                max(steps, warmup_steps + 1),
                                                end_value=learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(max_grad_norm),
                          optax.adamw(schedule, weight_decay=weight_decay))
  opt_state = optimizer.init(params)
  step_fn = make_sft_step(model, optimizer)
  losses = []
  start = time.perf_counter()
  for step in range(steps):
    batch = rollout_lib.as_device(make_batch(step))
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses.append(float(loss))
    if progress is not None:
      progress(step, losses[-1])
  return SFTResult(params=params, losses=losses, seconds=time.perf_counter() - start)


def sft_arith_batches(tokenizer, *, seed: int, batch_size: int, levels, weights,
                      prompt_prefix: Sequence[int], prompt_length: int, response_length: int,
                      direct_fraction: float = 0.0):
  """`make_batch(step)` for run_sft: fresh arith problems every step (never the eval set's
  seeds, which the caller keeps apart).

  A `direct_fraction` of the demonstrations give only the answer line
  (`Problem.direct_solution`) instead of the worked digit-serial solution: a
  demonstrator that is always right, but in a form the tiny student cannot imitate
  reliably. Which form to use is then the student's choice, and RL's to correct.
  """
  import numpy as np

  from rlhf_jax.tasks import arith

  def make_batch(step):
    problems = list(arith.generate(seed * 1_000_003 + step, batch_size, levels, weights))
    direct = np.random.default_rng([seed, step]).random(batch_size) < direct_fraction
    solutions = [p.direct_solution if d else p.solution for p, d in zip(problems, direct)]
    return encode_pairs(tokenizer, [p.prompt for p in problems], solutions,
                        prompt_prefix=prompt_prefix, prompt_length=prompt_length,
                        response_length=response_length)

  return make_batch
