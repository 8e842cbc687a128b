"""Supervised fine-tuning on (prompt, solution) rows: the warm start before RL.

The batch layout is the rollout layout (prompt left-padded to P, solution +
EOS right-padded to R), so SFT reuses `response_logprobs`: the loss is the
token-mean negative log-likelihood of the solution tokens.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import ml_collections

from rlhf_jax import kernels
from rlhf_jax import batch as batch_lib
from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.models import packing as packing_lib
from rlhf_jax.models.packing import PackedRows
from rlhf_jax.optim import FitResult
from rlhf_jax.optim import fit
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section


def sft_config() -> ml_collections.ConfigDict:
  """The `sft` section: the arith warm start (launch/sft.py, or train.py when missing) and
  supervised fine-tuning on one's own data (one comment per field)."""
  sft = ml_collections.ConfigDict()
  sft.steps = 450  # SFT steps.
  sft.batch_size = 64  # Problems per SFT step.
  sft.learning_rate = 3e-3  # Peak AdamW learning rate (warmup 20 steps, cosine to 10%).
  sft.levels = (1, 2)  # Difficulty levels of the SFT problems.
  sft.level_weights = (1.0, 2.0)  # Their weights (the harder level heavier).
  # Fraction of SFT demonstrations that give only "Answer: N" instead of the worked
  # digit-serial solution (a style RL can switch away from); 0 = worked solutions only.
  sft.direct_fraction = 0.0
  # Probability that the SFT teacher drops a carry or borrow coming into a line of its
  # worked solution (tasks/arith.py, slipped_solution). Above 0.5 the student's greedy
  # solutions drop every carry, a habit of reasoning the verifier's reward can correct
  # (the README's demo); 0 = a flawless teacher.
  sft.carry_slip = 0.6
  # One's own data (launch/sft.py, data.task empty): .jsonl/.parquet of conversations
  # ("messages") or prompt / completion pairs to fine-tune model.checkpoint on (loss on
  # the assistant's tokens); with model.checkpoint empty, a model.*-sized model and a BPE
  # tokenizer from scratch.
  sft.train_file = ""
  sft.response_length = 0  # Response tokens of a row (0: rollout.max_new_tokens + 1).
  sft.vocab_size = 1024  # From scratch: the byte-level BPE tokenizer's vocabulary.
  return sft


def validate_sft(sft: ml_collections.ConfigDict) -> None:
  """`sft.*`: the built-in task's warm start and the supervised data of one's own
  (`sft.levels` is the task table's check: tasks/registry.py); ConfigError naming the
  field."""
  at_least(sft, "sft", ("steps", "batch_size"))
  check_range("sft.response_length", sft.response_length, low=0,
              note="(0: rollout.max_new_tokens + 1)")
  check_range("sft.vocab_size", sft.vocab_size, low=300, note="(256 bytes + specials)")
  if sft.train_file and not os.path.isfile(sft.train_file):
    invalid("sft.train_file", sft.train_file, "must be an existing .jsonl/.parquet file of "
            "conversations or prompt/completion pairs")
  check_range("sft.learning_rate", sft.learning_rate, low=0, low_open=True)
  for field in ("direct_fraction", "carry_slip"):
    check_range(f"sft.{field}", sft[field], low=0, high=1)


def sft_loss(model, params, batch: batch_lib.RolloutBatch,
             packed: PackedRows | None = None) -> jax.Array:
  """Token-mean negative log-likelihood of the masked response tokens, from the padded
  rows or, with `packed`, from the rows packed into buffers (models/packing.py)."""
  logprobs = batch_lib.response_logprobs(model, params, batch, packed=packed)
  return -kernels.aggregate(logprobs, batch.response_mask, mode="token-mean")


def run_sft(model, params, make_batch: Callable[[int], Any], *, steps: int,
            learning_rate: float, **options) -> FitResult:
  """Trains the LM on `make_batch(step)` batches of (prompt, response) rows, a
  RolloutBatch or (RolloutBatch, PackedRows) (`fit` of `sft_loss`; options:
  warmup_steps, weight_decay, max_grad_norm, progress)."""
  def loss(p, batch):
    return sft_loss(model, p, *batch) if isinstance(batch, tuple) else sft_loss(model, p, batch)

  return fit(loss, params, make_batch, steps=steps, learning_rate=learning_rate, **options)


def supervised_batches(rows, *, batch_size: int, seed: int, prompt_length: int,
                       response_length: int, pad_id: int, packing: bool = False
                       ) -> Callable[[int], Any]:
  """`make_batch(step)` for run_sft over fixed `data.conversations.SupervisedRow`s: each
  epoch a fresh seeded shuffle, `batch_size` rows a step (the loss on each row's masked
  tokens: the assistant's). With `packing`, each batch comes with its packed-buffer plan
  (buffer counts in multiples of an eighth of the rows: at most eight shapes compile)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if not rows:
    raise ValueError("supervised_batches needs at least one row.")

  orders: dict[int, np.ndarray] = {}  # epoch → its shuffle (a step spans at most two)

  def order(epoch: int) -> np.ndarray:
    if epoch not in orders:
      if len(orders) > 1:  # keep two epochs: the one ending and the one starting
        orders.clear()
      orders[epoch] = np.random.default_rng([seed, epoch]).permutation(len(rows))
    return orders[epoch]

  def make_batch(step: int) -> batch_lib.RolloutBatch:
    picked = []
    for position in range(step * batch_size, (step + 1) * batch_size):
      epoch, index = divmod(position, len(rows))
      picked.append(rows[order(epoch)[index]])
    batch = batch_lib.build_rollout_batch(
        [r.prompt_ids for r in picked], [r.response_ids for r in picked],
        [[0.0] * len(r.response_ids) for r in picked], [0.0] * batch_size,
        [False] * batch_size, list(range(batch_size)), prompt_length=prompt_length,
        response_length=response_length, pad_id=pad_id,
        loss_masks=[r.loss_mask for r in picked])
    if not packing:
      return batch
    return batch, packing_lib.batch_plan(
        np.array([len(r.prompt_ids) for r in picked]),
        np.array([len(r.response_ids) for r in picked]), prompt_width=prompt_length,
        response_width=response_length)

  return make_batch


def check_sft_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `sft` section (the warm start)."""
  del checking
  validate_sft(c.sft)


SECTION = Section("sft", at="sft", fields=sft_config, check=check_sft_section)
