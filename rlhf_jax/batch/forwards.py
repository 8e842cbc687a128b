"""Model forwards over a rollout batch: the response tokens' log-probs (and entropy) under
a policy and the critic's values, padded or packed. Rollout (offline data), search (Q♯)
and every learner read the same [B, R] slices through these two functions."""

from __future__ import annotations

import jax

from rlhf_jax.batch.rollout_batch import RolloutBatch
from rlhf_jax.models import lm_head
from rlhf_jax.models.packing import PackedRows


def response_logprobs(model, params, batch: RolloutBatch, *, with_entropy: bool = False,
                      packed: PackedRows | None = None, replay: bool = True,
                      with_router: bool = False):
  """log π(y_t | x, y_<t) of the response tokens, and optionally the entropy, with the
  LM head chunked by `model.config.logprob_chunk` (`rlhf_jax.models.lm_head`), from
  the padded rows or, with `packed`, from the rows packed into buffers. A batch that
  carries the sampler's routes (`RolloutBatch.routes`) has a mixture-of-experts model
  replay them (routing replay, docs/moe.md) unless `replay` is False.

  Returns:
    logprobs [B, R] (and entropy [B, R] when `with_entropy`), float32, 0 where
    the response mask is 0; with `with_router`, the forward's `moe.RouterRecord` last
    (routes [B, P+R, L, k]).
  """
  return lm_head.rows_logprobs(model, params, batch.tokens, batch.attention_mask,
                               batch.response_mask, with_entropy=with_entropy, packed=packed,
                               replay_routes=batch.routes if replay else None,
                               with_router=with_router)


def response_values(critic, params, batch: RolloutBatch, *,
                    packed: PackedRows | None = None) -> jax.Array:
  """V(s_t) before each response token ([B, R]; the critic reads the same inputs as
  the policy, all P + R tokens, padded or packed)."""
  layout = {} if packed is not None else {"attention_mask": batch.attention_mask}
  values = critic.apply(params, batch.tokens, method=lm_head.token_values,
                        num_last=batch.response_length, packed=packed, **layout)
  return values * batch.response_mask
