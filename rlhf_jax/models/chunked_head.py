"""Token log-probabilities and entropy straight from the final hidden states, a chunk
of tokens at a time, so `[B, T, V]` logits never exist whole.

At V = 152k a 32 × 1024-token batch has 20 GB of float32 logits before the backward.
Here the LM head is applied to `chunk` tokens at a time inside a `lax.map` whose body
is rematerialised: the forward keeps only the per-token results, and the backward
recomputes one chunk's `[chunk, V]` logits, takes its gradient and moves on (the
head's gradient accumulates over chunks). Peak logit memory is one chunk's, forward
and backward, at the cost of a second head matmul in the backward — the same idea as
Liger's fused linear cross-entropy and MaxText's vocabulary tiling. The logits are
float32 (`decoder.lm_logits` accumulates and emits float32), so the log-probs carry no
bf16 rounding of the logits.

Four head GEMMs per chunk under `jax.grad` (forward, recompute, dh, dW) is the minimum
without keeping [T, V] logits: the backward needs the logits z (through p = softmax z)
and z cannot be rebuilt from what a custom VJP could keep per token (the log-sum-exp,
the entropy), since dW = Σ_t h_t ⊗ dz_t with dz_t = g_t (e_{a_t} − p_t) + ... needs every
p_t at the cotangents g_t, which the forward does not know yet. A custom VJP keeping the
per-token log-sum-exp would only save the backward's re-reduction over V, not a GEMM;
`jax.checkpoint` is kept.

The per-token formulas are those of `rlhf_jax.kernels.token_logprobs` and
`entropy_from_logits` (which this calls per chunk), so the chunked and unchunked
paths agree to float rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax import kernels
from rlhf_jax.models.decoder import lm_logits


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
