"""The router of a mixture-of-experts layer: which experts each token goes to, and with
what weights.

Qwen3-MoE (transformers' `Qwen3MoeTopKRouter`): p = softmax(logits) in float32, the top-k
experts by p, their p renormalised to sum to one when `norm_topk_prob`, then cast to the
logits' dtype. gpt-oss takes the top-k logits and a softmax over them, which is the same
renormalised top-k of p (softmax is monotone; its normaliser cancels).

Routing replay (the R3 paper, arXiv 2510.11370): with `replay`, the experts are given (the
ones the sampler or the old policy chose) and only their weights come from the live logits,
renormalised over the replayed experts, so the router still gets a gradient. A token whose
replayed row holds -1 (`NOT_RECORDED`: a prompt or padding position, which no sampler
routed) is routed live.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


NOT_RECORDED = -1  # a replay row for a token without recorded experts: route it live


def route_dtype(num_experts: int):
  """The narrowest signed integer dtype that holds expert indices below `num_experts` and
  NOT_RECORDED (int8 up to 127 experts)."""
  for dtype in (jnp.int8, jnp.int16, jnp.int32):
    if num_experts - 1 <= jnp.iinfo(dtype).max:
      return dtype
  raise ValueError(f"{num_experts} experts do not fit an int32 expert index.")


class Routes(NamedTuple):
  """Each token's experts and gate weights.

  Attributes:
    experts: [N, k] int32 expert indices, in descending router probability (a replayed
      choice keeps its recorded order).
    weights: [N, k] gate weights, in the router logits' dtype.
  """
  experts: jax.Array
  weights: jax.Array


def route(logits: jax.Array, top_k: int, *, normalize: bool,
          replay: jax.Array | None = None) -> Routes:
  """Routes tokens from router logits [N, X] (X experts) to `top_k` experts each.

  Args:
    logits: [N, X] router logits.
    top_k: experts per token (k ≤ X).
    normalize: renormalise the k probabilities to sum to one (Qwen3-MoE
      `norm_topk_prob`; gpt-oss always).
    replay: [N, k] integer experts to use instead of the top-k (routing replay); the
      weights are the live probabilities of those experts. A row with a NOT_RECORDED
      entry is routed live.
  Returns:
    Routes with experts [N, k] int32 and weights [N, k] in `logits.dtype`.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, top_k)
  if replay is not None:
    recorded = jnp.all(replay >= 0, axis=-1, keepdims=True)
    experts = jnp.where(recorded, replay.astype(jnp.int32), experts)
    weights = jnp.take_along_axis(probs, experts, axis=-1)
  if normalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return Routes(experts.astype(jnp.int32), weights.astype(logits.dtype))


class RouterRecord(NamedTuple):
  """What the routers of a forward did, per layer (L layers; dense ones hold
  NOT_RECORDED routes and zero sums). A `DecoderLM` returns it with `with_router=True`.

  Attributes:
    routes: [..., L, k] the experts each token was sent to (replayed ones under replay),
      in `route_dtype`.
    live: [..., L, k] the experts the live router's top-k picks (equal to `routes`
      without replay): compared with a sampler's routes, the route flip rate.
    load: [L, X] float32 tokens sent to each expert (counting each of a token's k),
      over the forward's real tokens.
    prob_sums: [L, X] float32 Σ over real tokens of the router's probabilities.
    z_sums: [L] float32 Σ over real tokens of logsumexp(router logits)².
    tokens: [L] float32 the real tokens each layer routed.
  """
  routes: jax.Array
  live: jax.Array
  load: jax.Array
  prob_sums: jax.Array
  z_sums: jax.Array
  tokens: jax.Array


def layer_record(logits: jax.Array, routes: Routes, top_k: int, valid: jax.Array,
                 dtype) -> RouterRecord:
  """One layer's `RouterRecord` (without the layer axis) from its router logits [N, X],
  the routes it used, and `valid` [N] (1 on real tokens): the sums the auxiliary losses
  (`record_losses`) and the load figures read."""
  num_experts = logits.shape[-1]
  mask = valid.astype(jnp.float32)
  logits = logits.astype(jnp.float32)
  _, live = jax.lax.top_k(logits, top_k)  # softmax is monotone: the top-k of p
  return RouterRecord(
      routes=routes.experts.astype(dtype), live=live.astype(dtype),
      load=expert_load(routes.experts, num_experts, mask),
      prob_sums=(jax.nn.softmax(logits, axis=-1) * mask[:, None]).sum(axis=0),
      z_sums=(jax.nn.logsumexp(logits, axis=-1) ** 2 * mask).sum(), tokens=mask.sum())


def record_losses(record: RouterRecord, sparse: jax.Array) -> dict[str, jax.Array]:
  """The auxiliary router losses of a forward, each the mean over its sparse layers
  (`sparse` [L] bool) of the layer's loss over its real tokens:
  - "load_balancing": Switch Transformer's X · Σ_x f_x · P_x (as `load_balancing_loss`),
    f_x the fraction of (token, slot) pairs sent to x, P_x x's mean router probability;
  - "z": ST-MoE's mean logsumexp(logits)² (as `router_z_loss`).
  And the load figures: "load_imbalance" [L] max/mean tokens per expert (1 when even; 0
  in dense layers)."""
  num_experts, top_k = record.load.shape[-1], record.routes.shape[-1]
  tokens = jnp.maximum(record.tokens, 1.0)  # [L]
  fraction = record.load / (tokens * top_k)[:, None]
  mean_prob = record.prob_sums / tokens[:, None]
  weights = sparse.astype(jnp.float32) / jnp.maximum(jnp.sum(sparse), 1)
  mean_load = jnp.maximum(record.load.mean(axis=-1), 1e-9)
  return {"load_balancing": jnp.sum(weights * num_experts * jnp.sum(fraction * mean_prob, -1)),
          "z": jnp.sum(weights * record.z_sums / tokens),
          "load_imbalance": jnp.where(sparse, record.load.max(axis=-1) / mean_load, 0.0)}


def route_flip_rate(routes: jax.Array, other: jax.Array, valid: jax.Array | None = None
                    ) -> jax.Array:
  """Per layer, the fraction of tokens whose set of experts differs between two routings
  of the same tokens (a sampler's and a trainer's: `moe/route_flip_rate`).

  Args:
    routes: [..., L, k] int experts (NOT_RECORDED rows: not counted).
    other: [..., L, k] the same tokens' experts from another forward.
    valid: [...] 1 on tokens that count (e.g. response tokens), or None for all.
  Returns:
    [L] float32; 0 where a layer has no counted token.
  """
  same = jnp.all(jnp.sort(routes, axis=-1) == jnp.sort(other, axis=-1), axis=-1)  # [..., L]
  counted = jnp.all(routes >= 0, axis=-1) & jnp.all(other >= 0, axis=-1)
  if valid is not None:
    counted = counted & valid.astype(bool)[..., None]
  axes = tuple(range(same.ndim - 1))
  flips = jnp.sum(counted & ~same, axis=axes).astype(jnp.float32)
  return flips / jnp.maximum(jnp.sum(counted, axis=axes), 1).astype(jnp.float32)


def expert_load(experts: jax.Array, num_experts: int, valid: jax.Array | None = None
                ) -> jax.Array:
  """Tokens routed to each expert: [X] float32 counts from experts [N, k] (`valid` [N]:
  1 on tokens that count, e.g. not padding). max/mean of it is the load imbalance."""
  one_hot = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32)  # [N, k, X]
  if valid is not None:
    one_hot = one_hot * valid.astype(jnp.float32)[:, None, None]
  return one_hot.sum(axis=(0, 1))


def load_balancing_loss(logits: jax.Array, experts: jax.Array,
                        valid: jax.Array | None = None) -> jax.Array:
  """The Switch Transformer's auxiliary loss (Fedus et al. 2021, eq. 4, as transformers'
  `load_balancing_loss_func` computes it for top-k): X · Σ_x f_x · P_x, where f_x is the
  fraction of routed (token, slot) pairs sent to expert x and P_x the mean router
  probability of x, over the `valid` [N] tokens. 1 when the load is uniform."""
  num_experts = logits.shape[-1]
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  mask = jnp.ones(logits.shape[:1], jnp.float32) if valid is None else valid.astype(
      jnp.float32)
  tokens = jnp.maximum(mask.sum(), 1.0)
  fraction = expert_load(experts, num_experts, mask) / (tokens * experts.shape[-1])
  mean_prob = (probs * mask[:, None]).sum(axis=0) / tokens
  return num_experts * jnp.sum(fraction * mean_prob)


def router_z_loss(logits: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean over the `valid` [N]
  tokens of logsumexp(logits)², which keeps router logits small."""
  z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1) ** 2
  if valid is None:
    return z.mean()
  mask = valid.astype(jnp.float32)
  return (z * mask).sum() / jnp.maximum(mask.sum(), 1.0)
