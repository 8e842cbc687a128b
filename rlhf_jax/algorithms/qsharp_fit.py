"""Fitting Q♯'s guide (algorithms/qsharp.py) on an aggregated dataset (DAgger-style):

    round 0: roll out π_ref from the prompt                      (every position is π_ref's)
    round i: roll in with the guided policy for t ~ U[1, R) tokens,
             roll out π_ref from there; label the response by the verifier
    after each round: refit the head on all data so far

A position's return is the row's outcome; it is a sample of Z_ref(s, a) when the
tokens after a are π_ref's, so the positions from the last roll-in token on count.
The reference is frozen: its hidden states are computed once per row and the head is
fitted on them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import numpy as np

from rlhf_jax.algorithms import qsharp
from rlhf_jax.optim import fit
from rlhf_jax.optim import make_optimizer
from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.models.packing import response_hidden
from rlhf_jax.parallel import run_in_chunks
from rlhf_jax.sampling import SamplingParams


@dataclasses.dataclass
class GuideData:
  """Rows of the aggregated dataset: the reference's hidden states before each response
  token [N, R, E], the tokens [N, R], the positions that count [N, R], returns [N]."""
  hidden: np.ndarray
  actions: np.ndarray
  mask: np.ndarray
  returns: np.ndarray

  def extend(self, other: "GuideData | None") -> "GuideData":
    """Both datasets' rows."""
    if other is None:
      return self
    return GuideData(*(np.concatenate([a, b]) for a, b in
                       zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def rollouts(ref_sampler, guided_sampler, prompts: Sequence[list[int]], *, samples: int,
             max_new_tokens: int, stop: tuple[int, ...], seed: int
             ) -> tuple[list[list[int]], list[list[int]], list[int]]:
  """(prompt per row, response per row, switch per row): π_ref roll-outs after a guided
  roll-in of t ~ U[1, R) tokens (no roll-in when `guided_sampler` is None; R ≥ 2)."""
  rng = np.random.default_rng(seed)
  rows = [p for p in prompts for _ in range(samples)]
  if guided_sampler is None:
    rollin = [[] for _ in rows]
  else:
    lengths = rng.integers(1, max_new_tokens, len(rows))
    params = [SamplingParams(max_new_tokens=int(t), stop_token_ids=stop, seed=int(s))
              for t, s in zip(lengths, rng.integers(2**31, size=len(rows)))]
    rollin = [c[0].token_ids for c in guided_sampler.generate(rows, params)]
  done = [bool(r) and r[-1] in stop for r in rollin]
  todo = [i for i, d in enumerate(done) if not d]
  params = [SamplingParams(max_new_tokens=max_new_tokens - len(rollin[i]), stop_token_ids=stop,
                           seed=int(s)) for i, s in zip(todo, rng.integers(2**31, size=len(todo)))]
  rollout = dict(zip(todo, (c[0].token_ids for c in ref_sampler.generate(
      [rows[i] + rollin[i] for i in todo], params))))
  responses = [rollin[i] + rollout.get(i, []) for i in range(len(rows))]
  return rows, responses, [max(len(r) - 1, 0) for r in rollin]


def guide_data(model, params, rows, responses, switches, returns, *, prompt_length: int,
               response_length: int, pad_id: int, chunk: int = 64) -> GuideData:
  """The reference's hidden states and the masks of the rows (positions ≥ switch)."""
  batch = build_rollout_batch(rows, responses, [[0.0] * len(r) for r in responses],
                              list(returns), [False] * len(rows), list(range(len(rows))),
                              prompt_length=prompt_length, response_length=response_length,
                              pad_id=pad_id, window_starts=list(switches))

  def hidden_states(p, b):  # the forward on whole rows (even lengths), as the trainer's
    return model.apply(p, b.tokens, method=response_hidden, num_last=b.response_length,
                       attention_mask=b.attention_mask)

  forward = jax.jit(hidden_states)
  hidden = run_in_chunks(lambda b: forward(params, b), [batch], chunk)
  # The switch rides as the rows' window start: the positions that count are `sampled_mask`.
  mask = np.asarray(batch.sampled_mask())
  return GuideData(hidden, np.asarray(batch.response_tokens), mask.astype(np.float32),
                   np.asarray(returns, np.float32))


def fit_guide(guide: dict, data: GuideData, *, values: np.ndarray, steps: int,
              batch_size: int, learning_rate: float, seed: int,
              log: Callable[[str], None] = print) -> tuple[dict, list[float]]:
  """Adam steps (`optim.fit`, constant rate, no clipping) of `qsharp.guide_loss` on
  random mini-batches of `data`."""
  loss_fn = functools.partial(qsharp.guide_loss, values=values)
  rng = np.random.default_rng(seed)

  def make_batch(step):
    del step  # a fresh random draw each step, in order
    index = rng.integers(0, len(data.returns), batch_size)
    return (data.hidden[index], data.actions[index], data.returns[index], data.mask[index])

  result = fit(lambda guide, batch: loss_fn(guide, *batch), guide, make_batch, steps=steps,
               learning_rate=learning_rate,
               optimizer=make_optimizer(learning_rate, max_grad_norm=None))
  losses = result.losses
  log(f"guide fitted on {len(data.returns)} rows: loss {losses[0]:.4f} → {losses[-1]:.4f}")
  return result.params, losses
