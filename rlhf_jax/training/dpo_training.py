"""Offline DPO of a policy on preference pairs (`algorithms/dpo.py`): the reference is
the starting policy, its log-probs cached once; `fit` (training/sft.py) runs the steps."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from rlhf_jax.algorithms import dpo
from rlhf_jax.training.sft import fit


@dataclasses.dataclass
class DPOResult:
  """Trained params, the loss curve, and held-out DPO metrics before and after."""
  params: dict
  losses: list[float]
  seconds: float
  before: dict[str, float]
  after: dict[str, float]


def pair_data(model, params, tokenizer, pairs, *, prefix: Sequence[int], prompt_length: int,
              response_length: int) -> dpo.PairBatch:
  """The PairBatch of `pairs` with the reference (`params`) log-probs cached."""
  chosen, rejected = dpo.encode_preference_pairs(tokenizer, pairs, prefix=prefix,
                                                 prompt_length=prompt_length,
                                                 response_length=response_length)
  ref_chosen, ref_rejected = dpo.reference_logps(model, params, chosen, rejected)
  return dpo.PairBatch(chosen, rejected, ref_chosen, ref_rejected)


def evaluate_pairs(objective, params, data: dpo.PairBatch, *, batch_size: int = 32
                   ) -> dict[str, float]:
  """Mean DPO loss and metrics (reward accuracy, margins, log-probs) over `data`."""
  evaluate = jax.jit(objective)
  count = data.ref_chosen.shape[0]
  totals: dict[str, float] = {}
  for start in range(0, count, batch_size):
    index = np.arange(start, start + batch_size) % count
    loss, metrics = evaluate(params, data.rows(index))
    weight = min(batch_size, count - start) / count  # the wrapped rows of the last chunk
    for key, value in dict(metrics, loss=loss).items():  # are counted by their weight
      totals[key] = totals.get(key, 0.0) + float(value) * weight
  return totals


def train_dpo(model, params, train: dpo.PairBatch, held_out: dpo.PairBatch, *, steps: int,
              batch_size: int, learning_rate: float, beta: float, kind: str = "sigmoid",
              label_smoothing: float = 0.0, seed: int = 0,
              progress: Callable[[int, float], None] | None = None) -> DPOResult:
  """DPO steps on random mini-batches of `train`; held-out metrics before and after."""
  objective = dpo.dpo_objective(model, beta=beta, kind=kind, label_smoothing=label_smoothing)
  rng = np.random.default_rng(seed)
  count = train.ref_chosen.shape[0]
  before = evaluate_pairs(objective, params, held_out)
  result = fit(lambda p, batch: objective(p, batch)[0], params,
               lambda step: train.rows(rng.integers(0, count, batch_size)), steps=steps,
               learning_rate=learning_rate, warmup_steps=min(20, steps), progress=progress)
  after = evaluate_pairs(objective, result.params, held_out)
  return DPOResult(result.params, result.losses, result.seconds, before, after)
