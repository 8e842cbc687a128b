"""Token log-probabilities and entropy straight from the final hidden states, a chunk
of tokens at a time, so `[B, T, V]` logits never exist whole.

At V = 152k a 32 × 1024-token batch has 20 GB of float32 logits before the backward.
Here the LM head is applied to `chunk` tokens at a time inside a `lax.map` whose body
is rematerialised: the forward keeps only the per-token results, and the backward
recomputes one chunk's `[chunk, V]` logits, takes its gradient and moves on (the
head's gradient accumulates over chunks). Peak logit memory is one chunk's, forward
and backward, at the cost of a second head matmul in the backward — the same idea as
Liger's fused linear cross-entropy and MaxText's vocabulary tiling.

The per-token formulas are those of `rlhf_jax.kernels.token_logprobs` and
`entropy_from_logits` (which this calls per chunk), so the chunked and unchunked
paths agree to float rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax import kernels
from rlhf_jax.models.decoder import lm_logits
from rlhf_jax.models.packing import PackedRows
from rlhf_jax.models.packing import response_hidden


def chunked_token_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array, *,
                           chunk: int, with_entropy: bool = False,
                           precision: jax.lax.Precision | None = None,
                           softcap: float | None = None):
  """log softmax(h·W)[target] for every token, `chunk` tokens at a time.

      log π(a_t | s_t) = (h_t·W)_{a_t} − log Σ_v exp((h_t·W)_v)
      H_t = −Σ_v π_v log π_v                      (with_entropy)

  Args:
    hidden: [..., E] final-normed hidden states (compute dtype).
    head: [E, V] LM head matrix (compute dtype).
    targets: [...] int token ids the hidden states predict.
    chunk: tokens per chunk (≥ 1); the token count is padded up to a multiple.
    with_entropy: also return the entropy of each position's distribution.
    precision: the head matmul's `jax.lax.Precision`.
    softcap: the logits are c·tanh(z/c) with c = `softcap` (Gemma 2's
      final_logit_softcapping), as the unchunked head; None: uncapped.
  Returns:
    logprobs [...] float32, and entropy [...] float32 when `with_entropy`.
  """
  if chunk < 1:
    raise ValueError(f"chunk={chunk} must be a positive number of tokens.")
  leading = targets.shape
  flat_hidden = hidden.reshape(-1, hidden.shape[-1])
  flat_targets = targets.reshape(-1)
  tokens = flat_targets.shape[0]
  chunks = -(-tokens // chunk)
  pad = chunks * chunk - tokens
  flat_hidden = jnp.pad(flat_hidden, ((0, pad), (0, 0)))
  flat_targets = jnp.pad(flat_targets, (0, pad))

  @jax.checkpoint  # the backward recomputes this chunk's logits instead of storing them
  def one_chunk(pieces):
    chunk_hidden, chunk_targets = pieces
    logits = lm_logits(chunk_hidden, head, precision, softcap)
    logprobs = kernels.token_logprobs(logits, chunk_targets)
    entropy = kernels.entropy_from_logits(logits) if with_entropy else jnp.zeros_like(logprobs)
    return logprobs, entropy

  logprobs, entropy = jax.lax.map(
      one_chunk, (flat_hidden.reshape(chunks, chunk, -1), flat_targets.reshape(chunks, chunk)))
  unpad = lambda x: x.reshape(-1)[:tokens].reshape(leading)
  return (unpad(logprobs), unpad(entropy)) if with_entropy else unpad(logprobs)


def token_logprobs(module, tokens: jax.Array, targets: jax.Array, *, chunk: int = 0,
                   with_entropy: bool = False, packed: PackedRows | None = None, **forward):
  """A `DecoderLM` method (pass as `FunctionalModel.apply(..., method=token_logprobs)`):
  log-probs of `targets` under the model, from the last `targets.shape[1]` positions.

  Args:
    module: the merged `DecoderLM` (LM head).
    tokens: [B, T] input ids.
    targets: [B, T'] ids predicted by the last T' positions (T' ≤ T).
    chunk: tokens per chunk of the LM head (`chunked_token_logprobs`); 0 applies the
      head to all positions at once ([B, T', V] logits).
    with_entropy: also return the entropy per position.
    packed: run the forward on the rows packed into buffers (`models.packing`).
    **forward: other `DecoderLM.__call__` arguments (attention_mask of padded rows).
  Returns:
    logprobs [B, T'] float32 (and entropy [B, T'] when `with_entropy`).
  """
  hidden = response_hidden(module, tokens, num_last=targets.shape[1], packed=packed,
                           **forward)
  if chunk:
    return chunked_token_logprobs(hidden, module.lm_head_matrix(), targets, chunk=chunk,
                                  with_entropy=with_entropy,
                                  precision=module.config.precision,
                                  softcap=module.config.final_logit_softcapping)
  logits = module.project(hidden)
  logprobs = kernels.token_logprobs(logits, targets)
  return (logprobs, kernels.entropy_from_logits(logits)) if with_entropy else logprobs


def token_values(module, tokens: jax.Array, *, num_last: int,
                 packed: PackedRows | None = None, **forward) -> jax.Array:
  """A scalar-head `DecoderLM` method: values [B, num_last] (float32) at the last
  `num_last` positions, padded or packed (`token_logprobs`'s arguments)."""
  return module.project(response_hidden(module, tokens, num_last=num_last, packed=packed,
                                        **forward))


def rows_logprobs(model, params, tokens: jax.Array, attention_mask: jax.Array,
                  response_mask: jax.Array, *, with_entropy: bool = False,
                  packed: PackedRows | None = None):
  """log π(y_t | x, y_<t) of the response tokens of rows laid out as the rollout batch
  (`algorithms.batch`): tokens and attention_mask [B, P+R], prompt left-padded, response
  right-padded in the last R = response_mask.shape[1] columns. The last token is dropped
  from the input (it predicts nothing scored). With `packed`, from the rows packed into
  buffers. Used by the trainer's forwards and by a sampling server's reference
  (sampling/reference.py).

  Returns:
    logprobs [B, R] (and entropy [B, R] when `with_entropy`), float32, 0 where
    `response_mask` is 0.
  """
  response_length = response_mask.shape[1]
  layout = {} if packed is not None else {"attention_mask": attention_mask[:, :-1]}
  out = model.apply(params, tokens[:, :-1], method=token_logprobs,
                    targets=tokens[:, -response_length:], chunk=model.config.logprob_chunk,
                    with_entropy=with_entropy, packed=packed, **layout)
  return tuple(x * response_mask for x in out) if with_entropy else out * response_mask
