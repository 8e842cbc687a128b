"""Training reward models: the Bradley–Terry RM on preference pairs, the PRM on step
labels, and generative judges (GenRM, pairwise) by SFT on verdict tokens. Each is `fit`
(optim/fit.py) of its loss on batches in the rollout layout; the launchers
launch/train_rm.py, train_prm.py and train_judge.py save the results as HF checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax.batch import encode_pairs
from rlhf_jax.data import Example
from rlhf_jax.data import PreferencePair
from rlhf_jax.rewards import genrm as genrm_lib
from rlhf_jax.rewards import pairwise as pairwise_lib
from rlhf_jax.rewards.prm import step_end_positions
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.parallel import run_in_chunks
from rlhf_jax.rewards.reward_model import sequence_scores
from rlhf_jax.optim import fit


@dataclasses.dataclass
class RewardTrainingResult:
  """Trained params, the loss curve, and the held-out metric(s) before and after."""
  params: dict
  losses: list[float]
  seconds: float
  before: float | dict[str, float]
  after: float | dict[str, float]


def scalar_model_from_policy(directory: str) -> tuple[models.FunctionalModel, dict]:
  """A scalar-head model whose backbone is the policy checkpoint's, head at zero (the
  usual RM initialisation from the SFT model)."""
  policy, params = models.load_hf_checkpoint(directory)
  return models.critic_from_policy(policy, params)


# ------------------------------------------------------------------ Bradley–Terry RM


def pair_rows(layout: ScoringLayout, pairs: Sequence[PreferencePair]):
  """(chosen tokens, chosen mask, rejected tokens, rejected mask) as NumPy arrays."""
  prompts = [p.prompt for p in pairs]
  chosen = encode_pairs(layout.tokenizer, prompts, [p.chosen for p in pairs],
                        prompt_prefix=layout.prefix, prompt_length=layout.prompt_length,
                        response_length=layout.response_length)
  rejected = encode_pairs(layout.tokenizer, prompts, [p.rejected for p in pairs],
                          prompt_prefix=layout.prefix, prompt_length=layout.prompt_length,
                          response_length=layout.response_length)
  return chosen.tokens, chosen.attention_mask, rejected.tokens, rejected.attention_mask


def bradley_terry_objective(model) -> Callable:
  """(params, (chosen tokens, mask, rejected tokens, mask)) → −log σ(s_w − s_l), mean
  (`kernels.bradley_terry_loss`; chosen and rejected in one forward)."""

  def loss(params, batch):
    chosen_tokens, chosen_mask, rejected_tokens, rejected_mask = batch
    scores = sequence_scores(model, params, jnp.concatenate([chosen_tokens, rejected_tokens]),
                             jnp.concatenate([chosen_mask, rejected_mask]))
    half = chosen_tokens.shape[0]
    return kernels.bradley_terry_loss(scores[:half], scores[half:])

  return loss


def pair_accuracy(model, params, layout: ScoringLayout, pairs: Sequence[PreferencePair], *,
                  batch_size: int = 64) -> float:
  """The fraction of pairs whose chosen response scores above the rejected one."""
  chosen_tokens, chosen_mask, rejected_tokens, rejected_mask = pair_rows(layout, pairs)
  score = jax.jit(lambda t, m: sequence_scores(model, params, t, m))
  chosen = run_in_chunks(score, [chosen_tokens, chosen_mask], batch_size)
  rejected = run_in_chunks(score, [rejected_tokens, rejected_mask], batch_size)
  return float(np.mean(chosen > rejected))


def train_bradley_terry(model, params, layout: ScoringLayout,
                        train: Sequence[PreferencePair], held_out: Sequence[PreferencePair], *,
                        steps: int, batch_size: int, learning_rate: float, seed: int = 0,
                        progress: Callable[[int, float], None] | None = None
                        ) -> RewardTrainingResult:
  """Trains a scalar-head model with the Bradley–Terry loss on random mini-batches of
  `train`; held-out pair accuracy before and after."""
  rows = pair_rows(layout, train)
  rng = np.random.default_rng(seed)
  make_batch = lambda step: tuple(r[rng.integers(0, len(train), batch_size)] for r in rows)
  before = pair_accuracy(model, params, layout, held_out)
  result = fit(bradley_terry_objective(model), params, make_batch, steps=steps,
               learning_rate=learning_rate, progress=progress)
  after = pair_accuracy(model, result.params, layout, held_out)
  return RewardTrainingResult(result.params, result.losses, result.seconds, before, after)


# ------------------------------------------------------------------ PRM


def step_targets(layout: ScoringLayout, prompts: Sequence[str], responses: Sequence[str],
                 labels: Sequence[Sequence[float]], step_end_ids: frozenset[int]):
  """(tokens, mask, targets [N, R], target mask [N, R]): each step's label at its
  step-end token (`prm.step_end_positions`)."""
  batch = encode_pairs(layout.tokenizer, prompts, responses, prompt_prefix=layout.prefix,
                       prompt_length=layout.prompt_length,
                       response_length=layout.response_length)
  targets = np.zeros((len(responses), layout.response_length), np.float32)
  where = np.zeros_like(targets)
  response_tokens = np.asarray(batch.tokens)[:, -layout.response_length:]
  lengths = np.asarray(batch.response_mask).sum(axis=1).astype(int)
  for row, (ids, n, row_labels) in enumerate(zip(response_tokens, lengths, labels)):
    ends = step_end_positions(ids[:n], step_end_ids, layout.tokenizer.eos_id)
    if len(ends) != len(row_labels):
      raise ValueError(f"row {row}: {len(row_labels)} step labels for {len(ends)} step ends "
                       "(the labels' steps must be the tokenizer's).")
    targets[row, ends] = row_labels
    where[row, ends] = 1.0
  return batch.tokens, batch.attention_mask, targets, where


def prm_objective(model, response_length: int) -> Callable:
  """(params, (tokens, mask, targets, target mask)) → mean squared error of the PRM's
  outputs at step ends against the 0/1 labels (a regression of the success
  probability, so the trained head is directly a value estimate)."""

  def loss(params, batch):
    tokens, mask, targets, where = batch
    values, _ = model.apply(params, tokens, attention_mask=mask, num_last=response_length)
    return jnp.sum(where * (values - targets) ** 2) / jnp.maximum(jnp.sum(where), 1.0)

  return loss


def step_label_metrics(model, params, rows, response_length: int, *,
                       batch_size: int = 64) -> dict[str, float]:
  """Held-out step labels against the PRM: `mse` (Brier score of its success
  probabilities; the labels are noisy 0/1 draws, so this is the measure to compare with
  a constant predictor's) and `accuracy` (on the right side of 0.5)."""
  tokens, mask, targets, where = rows
  values = run_in_chunks(jax.jit(lambda t, m: model.apply(
      params, t, attention_mask=m, num_last=response_length)[0]), [tokens, mask], batch_size)
  count = max(float(where.sum()), 1.0)
  hits = ((values > 0.5) == (targets > 0.5)) * where
  return {"mse": float((where * (values - targets) ** 2).sum() / count),
          "accuracy": float(hits.sum() / count)}


def constant_baseline_mse(train_rows, held_out_rows) -> float:
  """The held-out Brier score of always predicting the training labels' mean."""
  _, _, targets, where = train_rows
  rate = float((targets * where).sum() / max(where.sum(), 1.0))
  _, _, held_targets, held_where = held_out_rows
  return float((held_where * (held_targets - rate) ** 2).sum() / max(held_where.sum(), 1.0))


def train_prm(model, params, rows, held_out_rows, *, response_length: int, steps: int,
              batch_size: int, learning_rate: float, seed: int = 0,
              progress: Callable[[int, float], None] | None = None) -> RewardTrainingResult:
  """Trains a scalar-head PRM on `step_targets` rows; `before` / `after` are the held-out
  step-label metrics (`step_label_metrics`: mse, accuracy)."""
  rng = np.random.default_rng(seed)
  count = rows[0].shape[0]
  make_batch = lambda step: tuple(r[rng.integers(0, count, batch_size)] for r in rows)
  before = step_label_metrics(model, params, held_out_rows, response_length)
  result = fit(prm_objective(model, response_length), params, make_batch, steps=steps,
               learning_rate=learning_rate, progress=progress)
  after = step_label_metrics(model, result.params, held_out_rows, response_length)
  return RewardTrainingResult(result.params, result.losses, result.seconds, before, after)


# ------------------------------------------------------------------ generative judges


def genrm_sft_pairs(judged: Sequence[tuple[Example, str, bool]], *, template: str,
                    yes: str, no: str, reference_key: str = "reference"
                    ) -> list[tuple[str, str]]:
  """(question, verdict) texts of a GenRM from judged responses (the template's
  {reference}, if it has one, is `metadata[reference_key]`)."""
  return [(genrm_lib.judge_question(template, example, response,
                                    reference=(example.metadata or {}).get(reference_key, "")),
           yes if correct else no)
          for example, response, correct in judged]


def pairwise_sft_pairs(pairs: Sequence[PreferencePair], *, template: str, first: str,
                       second: str) -> list[tuple[str, str]]:
  """(question, verdict) texts of a pairwise judge: each pair in both orders (position
  swapping, Pairwise-RL), so the judge learns no position preference."""
  out = []
  for p in pairs:
    out.append((pairwise_lib.pair_question(template, p.prompt, p.chosen, p.rejected), first))
    out.append((pairwise_lib.pair_question(template, p.prompt, p.rejected, p.chosen), second))
  return out


def verdict_probabilities(model, params, tokenizer, prefix: Sequence[int],
                          questions: Sequence[str], verdict_ids: Sequence[int], *,
                          length: int, batch_size: int = 32) -> np.ndarray:
  """[N, K] softmax probabilities of the verdict tokens after each question, from a
  full forward (the reference the engine's candidate log-probs must match)."""
  ids, mask = tokenizer.pad([list(prefix) + tokenizer.encode(q) for q in questions],
                            length=length, side="right")
  last = mask.sum(axis=1).astype(np.int32) - 1
  verdicts = jnp.asarray(verdict_ids)

  @jax.jit
  def probs(tokens, attention, positions):
    logits, _ = model.apply(params, tokens, attention_mask=attention, head_positions=positions)
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)[:, verdicts]

  return run_in_chunks(probs, [ids, mask, last], batch_size)


def verdict_accuracy(model, params, tokenizer, prefix: Sequence[int],
                     examples: Sequence[tuple[str, str]], verdicts: Sequence[str], *,
                     length: int) -> float:
  """The fraction of (question, verdict) examples whose verdict token is the likelier
  of the verdict tokens under the judge."""
  ids = [tokenizer.encode(v)[0] for v in verdicts]
  probs = verdict_probabilities(model, params, tokenizer, prefix, [q for q, _ in examples],
                                ids, length=length)
  want = np.asarray([list(verdicts).index(v) for _, v in examples])
  return float(np.mean(probs.argmax(axis=1) == want))


def sft_rows(tokenizer, prefix: Sequence[int], examples: Sequence[tuple[str, str]], *,
             prompt_length: int):
  """The RolloutBatch of (question, verdict + EOS) rows for judge SFT."""
  return encode_pairs(tokenizer, [q for q, _ in examples], [v for _, v in examples],
                      prompt_prefix=prefix, prompt_length=prompt_length, response_length=2)


def save_beside_policy(output: str, model, params, policy_dir: str) -> None:
  """Writes an HF checkpoint with the policy's tokenizer and prompt format, atomically
  (a directory written aside, then renamed)."""
  import os  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  tokenizer = models.Tokenizer.from_directory(policy_dir)
  prefix = models.load_prompt_prefix(policy_dir, tokenizer)
  partial = output.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  models.save_policy(partial, model, params, tokenizer,
                     [tokenizer.backend.id_to_token(i) for i in prefix])
  shutil.rmtree(output, ignore_errors=True)
  os.replace(partial, output)


def policy_layout(policy_dir: str, prompt_length: int, response_length: int) -> ScoringLayout:
  """The ScoringLayout of a checkpoint's tokenizer and prompt prefix."""
  tokenizer = models.Tokenizer.from_directory(policy_dir)
  return ScoringLayout(tokenizer=tokenizer,
                       prefix=tuple(models.load_prompt_prefix(policy_dir, tokenizer)),
                       prompt_length=prompt_length, response_length=response_length)
