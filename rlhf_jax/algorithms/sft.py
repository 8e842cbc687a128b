"""Supervised fine-tuning on (prompt, solution) rows: the warm start before RL.

The batch layout is the rollout layout (prompt left-padded to P, solution +
EOS right-padded to R), so SFT reuses `response_logprobs`: the loss is the
token-mean negative log-likelihood of the solution tokens.
"""

from __future__ import annotations

from typing import Callable

import jax

from rlhf_jax import kernels
from rlhf_jax.algorithms import batch as batch_lib
from rlhf_jax.optim import FitResult
from rlhf_jax.optim import fit


def sft_loss(model, params, batch: batch_lib.RolloutBatch) -> jax.Array:
  """Token-mean negative log-likelihood of the response tokens."""
  logprobs = batch_lib.response_logprobs(model, params, batch)
  return -kernels.aggregate(logprobs, batch.response_mask, mode="token-mean")


def run_sft(model, params, make_batch: Callable[[int], batch_lib.RolloutBatch], *,
            steps: int, learning_rate: float, **options) -> FitResult:
  """Trains the LM on `make_batch(step)` batches of (prompt, response) rows (`fit` of
  `sft_loss`; options: warmup_steps, weight_decay, max_grad_norm, progress)."""
  return fit(lambda p, batch: sft_loss(model, p, batch), params, make_batch, steps=steps,
             learning_rate=learning_rate, **options)
