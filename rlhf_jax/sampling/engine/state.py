"""The engine's device state and results (sampling/engine/engine.py): a prefill's
`Prefix`, a slot's `SlotSampling`, the `DecodeState` the decode loop carries, a step's
`StepResult`, and a finished sample's cache row, `ParkedRow` (kept for a continuation)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import numpy as np

from rlhf_jax.models.decoder import KVCache
from rlhf_jax.sampling.params import SamplingParams


@flax.struct.dataclass
class Prefix:
  """The result of prefilling P prompts padded to one bucket length L.

  Attributes:
    keys, values: the prefill's KVCache keys / values (per layer [P, K, D, L] keys and
      [P, K, L, D] values; one [layers, P, ...] array each when the model's
      `scan_layers` is on).
    logits: [P, V] float32 next-token logits after each prompt.
    true_length: [P] int32 real prompt lengths (tokens at 0..true_length-1).
  """
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  logits: jax.Array
  true_length: jax.Array


@flax.struct.dataclass
class GuidedParams:
  """The params of an engine with a logits hook: the model's and the guide's (any pytree;
  `update_params` may replace either)."""
  model: Any
  guide: Any


@flax.struct.dataclass
class SlotSampling:
  """One sample's sampling parameters as fixed-dtype scalars (see `Engine.slot_sampling`)."""
  key: jax.Array  # [2] uint32 key data of fold_in(key(seed), sample_index)
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array
  min_p: jax.Array
  max_new_tokens: jax.Array
  stop_token_ids: jax.Array  # [max_stop_tokens] int32, -1 = unused
  fire: jax.Array  # bool: FIRE on
  fire_every_line: jax.Array
  fire_temperature: jax.Array
  fire_top_k: jax.Array
  keep_cache: jax.Array  # bool: a finished sample keeps its cache row until parked

  @classmethod
  def of(cls, params: SamplingParams, sample_index: int, *, seed: int | None,
         max_stop_tokens: int) -> "SlotSampling":
    """Sample `sample_index` of a request with `params` as per-slot host arrays; `seed`
    overrides `params.seed` (the scheduler's draw when that is None)."""
    seed = params.seed if seed is None else seed
    if seed is None:
      raise ValueError("seed is None: pass seed= or set SamplingParams.seed.")
    key = jax.random.fold_in(jax.random.key(seed), sample_index)
    stops = np.full((max_stop_tokens,), -1, np.int32)
    stops[:len(params.stop_token_ids)] = params.stop_token_ids
    fire = params.fire
    return cls(
        key=jax.random.key_data(key),
        temperature=np.float32(params.temperature),
        top_k=np.int32(params.top_k),
        top_p=np.float32(params.top_p),
        min_p=np.float32(params.min_p),
        max_new_tokens=np.int32(params.max_new_tokens),
        stop_token_ids=stops,
        fire=np.bool_(fire is not None),
        fire_every_line=np.bool_(fire is not None and fire.every_line),
        fire_temperature=np.float32(1.0 if fire is None else fire.temperature),
        fire_top_k=np.int32(0 if fire is None else fire.top_k),
        keep_cache=np.bool_(params.keep_cache))


@flax.struct.dataclass
class DecodeState:
  """Everything the decode loop carries, one row per slot (S = num_slots).

  Attributes:
    cache: the KV cache, [S, cache_length].
    next_token: [S] int32 each slot's next token, already drawn (at insert from the
      prefill's logits, then in each step from the fresh ones: no [S, V] logits are
      carried); the next step emits it.
    next_sampled_logprob, next_model_logprob: [S] its two log-probabilities.
    last_token: [S] int32 the slot's last emitted token (-1 before the first).
    generated: [S] int32 tokens emitted for the slot's current sample.
    active: [S] bool, the slot holds a sample that is still generating.
    sampling: SlotSampling with a leading [S] axis.
  """
  cache: KVCache
  next_token: jax.Array
  next_sampled_logprob: jax.Array
  next_model_logprob: jax.Array
  last_token: jax.Array
  generated: jax.Array
  active: jax.Array
  sampling: SlotSampling


@flax.struct.dataclass
class StepResult:
  """What one `generate` step produced, per slot ([S] each).

  Attributes:
    tokens: the drawn token (meaningful where `emitted`).
    sampled_logprobs: log-probability under the distribution it was drawn from.
    model_logprobs: log-probability under the model at temperature 1.
    emitted: the slot was active and produced a token this step.
    finished: that token ended the sample (a stop token or max_new_tokens).
    stopped: it ended because the token is a stop token.
    routes: [S, L, k] the experts the token was routed to in each layer, in the forward
      that read it (an engine with `record_routes`; None otherwise).
  """
  tokens: jax.Array
  sampled_logprobs: jax.Array
  model_logprobs: jax.Array
  emitted: jax.Array
  finished: jax.Array
  stopped: jax.Array
  routes: jax.Array | None = None


@flax.struct.dataclass
class ParkedRow:
  """One finished sample's KV cache row, taken out of its slot so that a continuation (the
  same tokens plus new ones: a multi-turn conversation) prefills only the new tokens.

  Attributes:
    keys, values: the row's KVCache keys / values (per layer [1, K, D, S] / [1, K, S, D];
      stacked [layers, 1, ...] with `scan_layers`).
    valid: [1, S] bool.
    end: [1] int32, the next position to write (= the tokens held).
    length: [1] int32, the real tokens held.
  """
  keys: Any
  values: Any
  valid: jax.Array
  end: jax.Array
  length: jax.Array

  def cache(self) -> KVCache:
    """The row as a one-row KVCache."""
    return KVCache(keys=self.keys, values=self.values, valid=self.valid, end=self.end,
                   length=self.length)

