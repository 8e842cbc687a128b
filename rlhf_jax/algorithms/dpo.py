"""Direct Preference Optimisation on preference pairs (Rafailov et al., arXiv:2305.18290;
IPO, Azar et al. arXiv:2310.12036; hinge / SLiC; ALGORITHMS.md §1.7, §12).

A pair is two rows of the rollout layout (prompt left-padded to P, response + EOS
right-padded to R; `algorithms.rollout.encode_pairs`): chosen and rejected. The
reference's sequence log-probs are computed once for the whole dataset
(`reference_logps`, a frozen pass) and ride in the batch, so a training step runs the
policy alone; `kernels.dpo_loss` gives the loss and the implicit-reward metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import kernels
from rlhf_jax.algorithms.rollout import RolloutBatch
from rlhf_jax.algorithms.rollout import encode_pairs
from rlhf_jax.algorithms.rollout import response_logprobs


@dataclasses.dataclass
class PairBatch:
  """Chosen and rejected rows of the same prompts, with the reference's [B] sequence
  log-probs of each (NumPy or device arrays)."""
  chosen: RolloutBatch
  rejected: RolloutBatch
  ref_chosen: np.ndarray
  ref_rejected: np.ndarray

  def rows(self, index: np.ndarray) -> "PairBatch":
    """The pairs at `index`."""
    take = lambda tree: jax.tree.map(lambda x: x[index], tree)
    return PairBatch(take(self.chosen), take(self.rejected), self.ref_chosen[index],
                     self.ref_rejected[index])


jax.tree_util.register_dataclass(PairBatch, data_fields=["chosen", "rejected", "ref_chosen",
                                                         "ref_rejected"], meta_fields=[])


def sequence_logps(model, params, batch: RolloutBatch) -> jax.Array:
  """[B] Σ_t log π(y_t | x, y_<t) over each row's response tokens (EOS included)."""
  return jnp.sum(response_logprobs(model, params, batch) * batch.response_mask, axis=1)


def encode_preference_pairs(tokenizer, pairs, *, prefix: Sequence[int], prompt_length: int,
                            response_length: int) -> tuple[RolloutBatch, RolloutBatch]:
  """(chosen rows, rejected rows) of `PreferencePair`s in the rollout layout."""
  prompts = [p.prompt for p in pairs]
  encode = lambda responses: encode_pairs(tokenizer, prompts, responses,
                                          prompt_prefix=prefix, prompt_length=prompt_length,
                                          response_length=response_length)
  return encode([p.chosen for p in pairs]), encode([p.rejected for p in pairs])


def reference_logps(model, params, chosen: RolloutBatch, rejected: RolloutBatch, *,
                    batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """The reference's [N] sequence log-probs of the chosen and rejected rows, computed once
  (jitted, fixed-size chunks) and kept on the host: the cache DPO trains against."""
  score = jax.jit(lambda rows: sequence_logps(model, params, rows))

  def over(batch: RolloutBatch) -> np.ndarray:
    count = batch.tokens.shape[0]
    out = []
    for start in range(0, count, batch_size):
      index = np.arange(start, start + batch_size) % count  # the last chunk wraps: one shape
      out.append(np.asarray(score(jax.tree.map(lambda x: x[index], batch))))
    return np.concatenate(out)[:count]

  return over(chosen), over(rejected)


def dpo_objective(model, *, beta: float, kind: str = "sigmoid", label_smoothing: float = 0.0
                  ) -> Callable[[dict, PairBatch], tuple[jax.Array, dict[str, jax.Array]]]:
  """(params, PairBatch) → (mean DPO loss over the pairs, metrics): `kernels.dpo_loss` of
  the policy's and the cached reference's sequence log-probs; metrics also hold the
  policy's mean chosen / rejected log-probs."""

  def loss(params, pairs: PairBatch):
    chosen = sequence_logps(model, params, pairs.chosen)
    rejected = sequence_logps(model, params, pairs.rejected)
    value, metrics = kernels.dpo_loss(chosen, rejected, pairs.ref_chosen, pairs.ref_rejected,
                                      beta=beta, kind=kind, label_smoothing=label_smoothing)
    return value, dict(metrics, chosen_logps=jnp.mean(chosen),
                       rejected_logps=jnp.mean(rejected))

  return loss
