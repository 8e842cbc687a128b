"""The rollout batch: fixed-shape arrays built from the sampler's completions.

Layout: each row is [prompt, left-padded to P | response, right-padded to R].
With the decoder's default positions (the count of real tokens before each
token) left padding is free, and every response sits at columns P..P+R-1 of
every row, so per-token arrays over the response are plain [B, R] slices.
Shapes come from the config (P = prompt bucket, R = max new tokens), so a run
compiles one update program.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import kernels
from rlhf_jax.models.moe import NOT_RECORDED
from rlhf_jax.models.packing import PackedRows


@flax.struct.dataclass(kw_only=True)
class RolloutBatch:
  """One step's rollouts as the rollout returns them (B = prompts × group size);
  `TrainBatch` (batch/train_batch.py) adds what `prepare` computes from them.

  Attributes:
    tokens: [B, P+R] int32 prompt (left-padded) and response (right-padded).
    attention_mask: [B, P+R] int32, 1 on real tokens.
    response_mask: [B, R] float32, 1 on response tokens that count in the loss.
    sampler_logprobs: [B, R] log π of each response token as the sampler reported
      it (at T=1): the behaviour policy's, in the sampler's precision.
    scores: [B] sequence-level rewards (verifier + shaping).
    lengths: [B] int32 response lengths (tokens, including a stop token).
    truncated: [B] bool, the response hit the length cap without a stop token.
    group_ids: [B] int32, rows of one prompt share an id and are contiguous.
    window_starts: [B] int32, the first response token sampled in this step
      (T-PPO's continued responses; 0 otherwise). Earlier tokens are context
      for the advantages but not trained on again.
    finished: [B] bool, the response ended (stop token or cap); False for a
      T-PPO response that continues in the next step.
    scored: [B] bool, some reward scored the row; False for a row that no reward
      function scored under `reward.unscored = "drop"`: `prepare` takes it out of the
      loss and the group estimators out of its group's statistics.
    step_rewards: [B, R] process rewards (a PRM's step scores) at step-end tokens, 0
      elsewhere; shaped in `prepare` (algorithm.process_reward: Clip / Delta).
    step_mask: [B, R] 1 at the step-end tokens that carry a step reward.
    token_versions: [B, R] int32, the policy version (the training step whose weights
      the sampler held) that sampled each response token; 0 on padding. A token is
      fresh when its version is the step being learned, else stale (decoupled PPO in
      `prepare`, docs/formulas.md#decoupled-ppo). T-PPO rows span one version per window.
    ref_logprobs: [B, R] log π_ref of the response tokens when the rollout brings them
      (the sampling servers' reference forward, `rollout.reference_logprobs='sampler'`;
      DPO's pairs), else None: the trainer's reference computes them in `prepare`.
    routes: [B, P+R, L, k] int, the experts the sampler routed each response token to in
      each layer (a mixture-of-experts sampler that records routes), NOT_RECORDED (-1) on
      the prompt and padding; the policy's forwards replay them (docs/moe.md). None
      without recorded routes.
  """
  tokens: jax.Array
  attention_mask: jax.Array
  response_mask: jax.Array
  sampler_logprobs: jax.Array
  scores: jax.Array
  lengths: jax.Array
  truncated: jax.Array
  group_ids: jax.Array
  window_starts: jax.Array
  finished: jax.Array
  scored: jax.Array
  step_rewards: jax.Array
  step_mask: jax.Array
  token_versions: jax.Array
  ref_logprobs: jax.Array | None = None
  routes: jax.Array | None = None

  @property
  def response_length(self) -> int:
    """R, response columns."""
    return self.response_mask.shape[1]

  @property
  def response_tokens(self) -> jax.Array:
    """[B, R] the response token ids."""
    return self.tokens[:, -self.response_length:]

  def token_rewards(self) -> jax.Array:
    """[B, R] the score placed on each row's last response token."""
    return kernels.place_at_last_token(self.scores, self.response_mask)

  def sampled_mask(self) -> jax.Array:
    """[B, R] the tokens sampled in this step (T-PPO: this window), before any
    rollout correction: where the sampler–trainer mismatch is measured."""
    columns = jnp.arange(self.response_length, dtype=jnp.int32)[None, :]
    return self.response_mask * (columns >= self.window_starts[:, None])

  def stale_mask(self, version: jax.Array | int) -> jax.Array:
    """[B, R] 1 on the sampled tokens that are stale when policy `version` is learned: the
    one place where `token_versions` become fresh / stale (decoupled PPO in
    `ppo_family.behaviour_correction`): a token of another version. A partial rollout's
    row spans versions; its tokens of `version` are fresh, as the sampler recomputes the
    KV cache of the samples in flight under the new weights at a swap
    (sampling/scheduler/swaps.py), so the tokens after it are the new policy's."""
    stale = self.token_versions != jnp.asarray(version, jnp.int32)
    return (stale & (self.sampled_mask() > 0)).astype(jnp.float32)

  def value_mask(self) -> jax.Array:
    """[B, R] the tokens the value loss uses: finished responses only (T-PPO trains
    the critic on complete trajectories; every row is finished otherwise)."""
    return self.response_mask * self.finished[:, None]


def build_rollout_batch(prompt_ids: Sequence[Sequence[int]],
                        responses: Sequence[Sequence[int]],
                        sampler_logprobs: Sequence[Sequence[float]], scores: Sequence[float],
                        truncated: Sequence[bool], group_ids: Sequence[int], *,
                        prompt_length: int, response_length: int, pad_id: int,
                        window_starts: Sequence[int] | None = None,
                        finished: Sequence[bool] | None = None,
                        step_rewards: Sequence[Sequence[tuple[int, float]]] | None = None,
                        token_versions: Sequence[Sequence[int]] | None = None,
                        loss_masks: Sequence[Sequence[int]] | None = None,
                        scored: Sequence[bool] | None = None,
                        routes: Sequence[np.ndarray | None] | None = None) -> RolloutBatch:
  """Packs host-side rollouts into a RolloutBatch of NumPy arrays (`window_starts`
  default 0, `finished` default True: whole responses; `step_rewards` per row a list of
  (response column, process reward) pairs, default none; `token_versions` per row the
  policy version of each response token, default 0: the starting policy; `loss_masks`
  per row 0/1 per response token, default 1: multi-turn rows put 0 on the environment's
  tokens, which are context but not the policy's actions; `scored` default True: see
  `RolloutBatch.scored`; `routes` per row its response tokens' experts [n, L, k] or None,
  default none: see `RolloutBatch.routes`).

  Raises:
    ValueError: naming the row if a prompt or response does not fit, or if its
      versions are not one per response token.
  """
  batch = len(responses)
  tokens = np.full((batch, prompt_length + response_length), pad_id, np.int32)
  attention = np.zeros_like(tokens)
  response_mask = np.zeros((batch, response_length), np.float32)
  logprobs = np.zeros((batch, response_length), np.float32)
  lengths = np.zeros((batch,), np.int32)
  for row, (prompt, response, lps) in enumerate(zip(prompt_ids, responses,
                                                     sampler_logprobs)):
    if len(prompt) > prompt_length:
      raise ValueError(f"row {row}: prompt of {len(prompt)} tokens exceeds prompt_length="
                       f"{prompt_length}.")
    if len(response) > response_length:
      raise ValueError(f"row {row}: response of {len(response)} tokens exceeds "
                       f"response_length={response_length}.")
    tokens[row, prompt_length - len(prompt):prompt_length] = prompt
    attention[row, prompt_length - len(prompt):prompt_length] = 1
    n = len(response)
    if loss_masks is not None and len(loss_masks[row]) != n:
      raise ValueError(f"row {row}: a loss mask of {len(loss_masks[row])} for a response of "
                       f"{n} tokens (one per token).")
    tokens[row, prompt_length:prompt_length + n] = response
    attention[row, prompt_length:prompt_length + n] = 1
    response_mask[row, :n] = 1.0 if loss_masks is None else loss_masks[row]
    logprobs[row, :n] = lps
    lengths[row] = n
  zeros = lambda: np.zeros((batch, response_length), np.float32)
  versions = np.zeros((batch, response_length), np.int32)
  for row, row_versions in enumerate(token_versions or ()):
    if len(row_versions) != lengths[row]:
      raise ValueError(f"row {row}: {len(row_versions)} token versions for a response of "
                       f"{lengths[row]} tokens (one version per token).")
    versions[row, :lengths[row]] = row_versions
  process, process_mask = zeros(), zeros()
  for row, steps in enumerate(step_rewards or ()):
    for column, reward in steps:
      if 0 <= column < lengths[row]:
        process[row, column] = reward
        process_mask[row, column] = 1.0
  return RolloutBatch(routes=_routes_columns(routes, lengths, prompt_length, response_length),
                      tokens=tokens, attention_mask=attention, response_mask=response_mask,
                      sampler_logprobs=logprobs, step_rewards=process, step_mask=process_mask,
                      token_versions=versions,
                      scores=np.asarray(scores, np.float32), lengths=lengths,
                      truncated=np.asarray(truncated, bool),
                      group_ids=np.asarray(group_ids, np.int32),
                      window_starts=np.asarray(
                          [0] * batch if window_starts is None else window_starts, np.int32),
                      finished=np.asarray([True] * batch if finished is None else finished,
                                          bool),
                      scored=np.asarray([True] * batch if scored is None else scored, bool))


def _routes_columns(routes, lengths, prompt_length: int, response_length: int):
  """Each row's response routes [n, L, k] at its response columns of a [B, P+R, L, k]
  array of NOT_RECORDED; None when no row has routes."""
  known = [r for r in routes or () if r is not None]
  if not known:
    return None
  shape = np.shape(known[0])[1:]
  out = np.full((len(lengths), prompt_length + response_length) + shape, NOT_RECORDED,
                np.asarray(known[0]).dtype)
  for row, row_routes in enumerate(routes):
    if row_routes is None:
      continue
    if np.shape(row_routes) != (lengths[row],) + shape:
      raise ValueError(f"row {row}: routes of shape {list(np.shape(row_routes))} for a "
                       f"response of {lengths[row]} tokens (one [layers, top_k] {list(shape)} "
                       "per token).")
    out[row, prompt_length:prompt_length + lengths[row]] = row_routes
  return out


def encode_pairs(tokenizer, prompts: Sequence[str], responses: Sequence[str], *,
                 prompt_prefix: Sequence[int], prompt_length: int, response_length: int
                 ) -> RolloutBatch:
  """Tokenizes prompt/response texts into a RolloutBatch (response + EOS as the response
  tokens): the layout of SFT batches and of the inputs reward models score.

  Raises:
    ValueError: naming the row if a prompt or response does not fit.
  """
  prompt_ids = [list(prompt_prefix) + tokenizer.encode(p) for p in prompts]
  encoded = [tokenizer.encode(r) + [tokenizer.eos_id] for r in responses]
  zeros = [[0.0] * len(r) for r in encoded]
  return build_rollout_batch(
      prompt_ids, encoded, zeros, [0.0] * len(prompts), [False] * len(prompts),
      list(range(len(prompts))), prompt_length=prompt_length,
      response_length=response_length, pad_id=tokenizer.pad_id)


def only_packed_rows(batch: RolloutBatch, packed: PackedRows) -> RolloutBatch:
  """The batch with the response mask of rows outside `packed` zeroed: a packed
  micro-batch's loss counts only its own rows (the mini-batch's normalizers stay)."""
  present = jnp.any(packed.response_index >= 0, axis=1)
  return batch.replace(response_mask=batch.response_mask * present[:, None])


def as_device(batch: RolloutBatch) -> RolloutBatch:
  """Every field as a jax array."""
  return jax.tree.map(jnp.asarray, batch)
