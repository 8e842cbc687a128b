"""Log-probabilities, entropy and values of given tokens from a `DecoderLM`'s forward:
the padded and packed row layouts of the rollout batch (`rlhf_jax.batch`), the LM head
applied a chunk of tokens at a time (`rlhf_jax.models.chunked_head`)."""

from __future__ import annotations

import jax

from rlhf_jax import kernels
from rlhf_jax.models.chunked_head import chunked_token_logprobs
from rlhf_jax.models.packing import PackedRows
from rlhf_jax.models.packing import response_hidden


def token_logprobs(module, tokens: jax.Array, *, num_last: int, chunk: int = 0,
                   with_entropy: bool = False, packed: PackedRows | None = None,
                   with_router: bool = False, **forward):
  """A `DecoderLM` method (pass as `FunctionalModel.apply(..., method=token_logprobs)`):
  log-probs of the last `num_last` tokens of each row under the model, each from the
  state before it (the forward runs on all of `tokens`: `packing.response_hidden`).

  Args:
    module: the merged `DecoderLM` (LM head).
    tokens: [B, W] ids, whole rows (W = P + R).
    num_last: R, the scored tokens at the end of each row (R < W).
    chunk: tokens per chunk of the LM head (`chunked_token_logprobs`); 0 applies the
      head to all positions at once ([B, R, V] logits).
    with_entropy: also return the entropy per position.
    packed: run the forward on the rows packed into buffers (`models.packing`).
    with_router: also return the forward's `moe.RouterRecord` (a mixture-of-experts
      model; routes [B, W, L, k] at the rows' columns), last.
    **forward: other `DecoderLM.__call__` arguments (attention_mask [B, W] of padded
      rows).
  Returns:
    logprobs [B, R] float32 (and entropy [B, R] when `with_entropy`; and the record).
  """
  targets = tokens[:, -num_last:]
  hidden = response_hidden(module, tokens, num_last=num_last, packed=packed,
                           with_router=with_router, **forward)
  record = ()
  if with_router:
    hidden, record = hidden[0], (hidden[1],)
  if chunk:
    out = chunked_token_logprobs(hidden, module.lm_head_matrix(), targets, chunk=chunk,
                                 with_entropy=with_entropy, precision=module.config.precision,
                                 softcap=module.config.final_logit_softcapping)
  else:
    logits = module.project(hidden)
    logprobs = kernels.token_logprobs(logits, targets)
    out = (logprobs, kernels.entropy_from_logits(logits)) if with_entropy else logprobs
  if not record:
    return out
  return (*out, *record) if with_entropy else (out, *record)


def token_values(module, tokens: jax.Array, *, num_last: int,
                 packed: PackedRows | None = None, **forward) -> jax.Array:
  """A scalar-head `DecoderLM` method: values [B, num_last] (float32) of the states
  before each of the last `num_last` tokens of the rows [B, W], padded or packed
  (`token_logprobs`'s arguments)."""
  return module.project(response_hidden(module, tokens, num_last=num_last, packed=packed,
                                        **forward))


def rows_logprobs(model, params, tokens: jax.Array, attention_mask: jax.Array,
                  response_mask: jax.Array, *, with_entropy: bool = False,
                  packed: PackedRows | None = None, replay_routes: jax.Array | None = None,
                  with_router: bool = False):
  """log π(y_t | x, y_<t) of the response tokens of rows laid out as the rollout batch
  (`rlhf_jax.batch`): tokens and attention_mask [B, P+R], prompt left-padded, response
  right-padded in the last R = response_mask.shape[1] columns. The forward runs on all
  P + R tokens (even, aligned lengths for fused attention kernels) and reads the states
  at [P − 1, P + R − 1). With `packed`, from the rows packed into buffers. Used by the
  trainer's forwards and by a sampling server's reference (sampling/serve/reference.py).
  `replay_routes` [B, P+R, L, k]: a mixture-of-experts model routes each token to these
  experts (routing replay; NOT_RECORDED rows routed live), padded or packed.
  `with_router`: also return the forward's `moe.RouterRecord`, last (routes [B, P+R, L, k]
  at the rows' columns, padded or packed).

  Returns:
    logprobs [B, R] (and entropy [B, R] when `with_entropy`), float32, 0 where
    `response_mask` is 0.
  """
  layout = {} if packed is not None else {"attention_mask": attention_mask}
  if replay_routes is not None:
    layout["replay_routes"] = replay_routes
  if with_router:
    layout["with_router"] = True
  out = model.apply(params, tokens, method=token_logprobs, num_last=response_mask.shape[1],
                    chunk=model.config.logprob_chunk, with_entropy=with_entropy,
                    packed=packed, **layout)
  record = ()
  if with_router:
    out, record = (out[:-1] if with_entropy else out[0]), (out[-1],)
  masked = tuple(x * response_mask for x in out) if with_entropy else (out * response_mask,)
  return masked + record if (with_entropy or record) else masked[0]
