"""A sampling engine in JetStream's shape: prefill, insert into a decode slot, generate.

    prefix = engine.prefill(params, tokens, true_length)      # [P, L] prompts
    state = engine.insert(prefix, state, slot, row=r, sampling=engine.slot_sampling(sp, i))
    state, result = engine.generate(params, state)             # one token for every slot

The decode state holds a preallocated KV cache of `num_slots` rows ×
`cache_length` positions and, per slot, the next token (drawn ahead: `insert`
draws the first from the prefill's logits), the sampling parameters and PRNG key.
`generate` emits each active slot's next token, runs the model one step on it and
draws the one after from the fresh logits (no [S, V] logits carried); finished
and empty slots ride along (fixed shapes) and emit nothing. The device decides
when a slot is done (a stop token or `max_new_tokens`), so the host only has to
read results, and `generate_steps` can run several steps per dispatch.

Compilation: `prefill` once per (prefill batch, prompt-length bucket), `insert` once
per prefix shape (one in all for `prefill_rows`' rows), `generate` once per
`num_steps`; nothing recompiles in steady state (`Engine.compilations()` counts them). The decode state is donated, so the
cache is updated in place.

Randomness: sample i of a request with seed s draws its t-th token with
key fold_in(fold_in(key(s), i), t), so its tokens do not depend on which slot
it got or what else is in the batch. Whether a draw may need truncation is tracked
on the host and compiled in (`truncate`): a step holds no conditional.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.models.decoder import KVCache
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import Params
from rlhf_jax.sampling.engine.state import DecodeState
from rlhf_jax.sampling.engine.state import ParkedRow
from rlhf_jax.sampling.engine.state import Prefix
from rlhf_jax.sampling.engine.state import SlotSampling
from rlhf_jax.sampling.engine.state import StepResult
from rlhf_jax.sampling.engine.token_sampling import draw_for_slots
from rlhf_jax.sampling.engine.token_sampling import needs_truncation
from rlhf_jax.sampling.params import SamplingParams


@dataclasses.dataclass
class Engine:
  """Prefill / insert / generate over a fixed number of decode slots.

  Args:
    model: the policy (LM head).
    num_slots: S, concurrent samples in the decode batch.
    cache_length: positions per slot: the longest prompt bucket plus the most
      new tokens any request may ask for.
    newline_token_ids: tokens whose text ends a line (FIRE's every-line mode).
    max_stop_tokens: room for stop token ids per request.
    logits_hook: None, or a jittable hook(guide, hidden [B, E], logits [B, V]) → logits
      applied wherever the model's next-token logits are made (prefill and every
      decode step), inside the same jitted programs: guided decoding (Q♯) without a
      host round trip. The engine's params are then `GuidedParams(model, guide)`,
      and a Completion's `model_logprobs` are the guided distribution's (T = 1).
    record_routes: a mixture-of-experts model's decode steps return each emitted token's
      experts per layer (`StepResult.routes`), from the forward that reads the token: the
      routes a trainer's forward replays (routing replay, docs/moe.md).
  """
  model: FunctionalModel
  num_slots: int
  cache_length: int
  newline_token_ids: Sequence[int] = ()
  max_stop_tokens: int = 4
  logits_hook: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None
  record_routes: bool = False

  def __post_init__(self):
    if self.model.head != "lm":
      raise ValueError(f"Engine needs a model with an LM head; got head={self.model.head!r}.")
    if self.record_routes and (not self.model.config.num_experts or self.logits_hook):
      raise ValueError("record_routes needs a mixture-of-experts model without a logits_hook.")
    for name in ("num_slots", "cache_length", "max_stop_tokens"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer.")
    vocab = self.model.config.vocab_size
    bad = [t for t in self.newline_token_ids if not 0 <= int(t) < vocab]
    if bad:
      raise ValueError(f"newline_token_ids {bad} are outside the vocabulary (size {vocab}).")
    newline = np.zeros((vocab,), bool)
    newline[list(self.newline_token_ids)] = True
    self._newline = newline
    self._traces = collections.Counter()
    self._prefill = jax.jit(self._prefill_impl, static_argnums=(3, 4))
    self._insert = jax.jit(self._insert_impl, donate_argnums=(1,))
    self._generate = jax.jit(self._generate_impl, static_argnums=(2, 3), donate_argnums=(1,))
    self._park = jax.jit(self._park_impl, donate_argnums=(0,))
    self._resume = jax.jit(self._resume_impl, donate_argnums=(2,))
    # The schedulers' compiled init_decode_state, per params mesh (programs.state_program):
    # compiled once per engine, not once per Scheduler built on it.
    self.state_programs: dict = {}
    # Host side, per slot: its draws may need truncation, for at most this many more steps.
    self._truncating, self._steps_left = np.zeros((self.num_slots,), bool), np.zeros(
        (self.num_slots,), np.int64)

  # ---------------------------------------------------------------- public API

  @property
  def vocab_size(self) -> int:
    """V, the model's vocabulary size."""
    return self.model.config.vocab_size

  def compilations(self) -> dict[str, int]:
    """How many times each jitted function was traced (one per compiled shape)."""
    return dict(self._traces)

  def init_decode_state(self) -> DecodeState:
    """An empty decode state: every slot free."""
    slots = self.num_slots
    sampling = jax.tree.map(lambda x: jnp.broadcast_to(x, (slots,) + x.shape),
                            self.slot_sampling(SamplingParams(), 0, seed=0))
    return DecodeState(
        cache=KVCache.create(self.model.config, slots, self.cache_length),
        next_token=jnp.zeros((slots,), jnp.int32),
        next_sampled_logprob=jnp.zeros((slots,), jnp.float32),
        next_model_logprob=jnp.zeros((slots,), jnp.float32),
        last_token=jnp.full((slots,), -1, jnp.int32),
        generated=jnp.zeros((slots,), jnp.int32),
        active=jnp.zeros((slots,), bool),
        sampling=sampling)

  def slot_sampling(self, params: SamplingParams, sample_index: int, *,
                    seed: int | None = None) -> SlotSampling:
    """Sample `sample_index` of a request as per-slot arrays (host → device once).

    Args:
      params: the request's SamplingParams.
      sample_index: which of its `n` samples (selects the PRNG stream).
      seed: overrides `params.seed` (the scheduler's draw when that is None).
    """
    params.check_against(vocab_size=self.vocab_size, max_stop_tokens=self.max_stop_tokens)
    return SlotSampling.of(params, sample_index, seed=seed, max_stop_tokens=self.max_stop_tokens)

  def prefill(self, params: Params, tokens, true_length) -> Prefix:
    """Runs P prompts through the model and keeps their KV and next-token logits.

    Args:
      params: model parameters.
      tokens: [P, L] int32 prompts, right-padded to a bucket length L.
      true_length: [P] int32 real lengths, 1 ≤ true_length ≤ L.
    Returns:
      A Prefix.
    """
    tokens, true_length = self._check_prompts(tokens, true_length)
    return self._prefill(params, tokens, true_length, tokens.shape[1], False)

  def _check_prompts(self, tokens, true_length) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.asarray(tokens, np.int32)
    true_length = np.asarray(true_length, np.int32)
    if tokens.ndim != 2 or true_length.shape != tokens.shape[:1]:
      raise ValueError(f"tokens must be [P, L] and true_length [P]; got {tokens.shape} and "
                       f"{true_length.shape}.")
    if tokens.shape[1] > self.cache_length:
      raise ValueError(f"prompt bucket length {tokens.shape[1]} exceeds cache_length="
                       f"{self.cache_length}.")
    if np.any(true_length < 1) or np.any(true_length > tokens.shape[1]):
      raise ValueError(f"true_length must be in [1, {tokens.shape[1]}]; got {true_length}.")
    return tokens, true_length

  def prefill_rows(self, params: Params, tokens, true_length, *, pad_to: int
                   ) -> list[Prefix]:
    """As `prefill`, but each prompt's row on its own, its KV padded to `pad_to` positions:
    P Prefixes of one row ([1, ..., pad_to] KV, [1, V] logits), made in the same program.

    Every row has one shape whatever the bucket and prefill batch, so one insert program
    serves them all (fewer programs compile: each is autotuned on a GPU). `pad_to` is
    at least the bucket length L and at most `cache_length`; positions past a prompt's
    true length are never attended to (insert marks them invalid).
    """
    tokens, true_length = self._check_prompts(tokens, true_length)
    if not tokens.shape[1] <= pad_to <= self.cache_length:
      raise ValueError(f"pad_to={pad_to} must be in [bucket length {tokens.shape[1]}, "
                       f"cache_length={self.cache_length}].")
    return list(self._prefill(params, tokens, true_length, int(pad_to), True))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int, *, row: int = 0,
             sampling: SlotSampling) -> DecodeState:
    """Puts prefix row `row` into decode slot `slot` with the given sampling parameters.

    The input `decode_state` is donated (updated in place): use the returned one.
    """
    if not 0 <= slot < self.num_slots:
      raise ValueError(f"slot={slot} is outside [0, {self.num_slots}).")
    if not 0 <= row < prefix.logits.shape[0]:
      raise ValueError(f"row={row} is outside the prefix's {prefix.logits.shape[0]} rows.")
    self._track(slot, sampling)
    return self._insert(prefix, decode_state, np.int32(slot), np.int32(row), sampling)

  def park(self, decode_state: DecodeState, slot: int) -> tuple[DecodeState, ParkedRow]:
    """Takes the cache row of slot `slot`, whose sample finished with `keep_cache`, out
    of the decode state (a copy on the device) and frees the slot; the input state is
    donated. The row holds the prompt and every emitted token, the last one included."""
    if not 0 <= slot < self.num_slots:
      raise ValueError(f"slot={slot} is outside [0, {self.num_slots}).")
    return self._park(decode_state, np.int32(slot))

  def resume(self, params: Params, parked: ParkedRow, decode_state: DecodeState, slot: int,
             tokens, true_length: int, *, sampling: SlotSampling) -> DecodeState:
    """Puts a parked row into slot `slot` and prefills only the new tokens after it: the
    slot then continues the conversation as if its whole prompt had been prefilled.

    Args:
      params: model parameters (the weights the parked row was computed with).
      parked: from `park`, holding H tokens.
      decode_state: donated; use the returned one.
      slot: a free slot.
      tokens: [1, L] int32 new tokens, right-padded to a bucket length L (H + L must fit
        `cache_length`).
      true_length: the real new tokens, 1 ≤ true_length ≤ L.
      sampling: the continuation's SlotSampling.
    """
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or tokens.shape[0] != 1:
      raise ValueError(f"tokens must be [1, L]; got {tokens.shape}.")
    if not 1 <= true_length <= tokens.shape[1]:
      raise ValueError(f"true_length={true_length} must be in [1, {tokens.shape[1]}].")
    if not 0 <= slot < self.num_slots:
      raise ValueError(f"slot={slot} is outside [0, {self.num_slots}).")
    self._track(slot, sampling)
    return self._resume(params, parked, decode_state, np.int32(slot), tokens,
                        np.int32(true_length), sampling)

  def generate(self, params: Params, decode_state: DecodeState
               ) -> tuple[DecodeState, StepResult]:
    """One decode step for every slot; the input state is donated."""
    state, results = self.generate_steps(params, decode_state, 1)
    return state, jax.tree.map(lambda x: x[0], results)

  def generate_steps(self, params: Params, decode_state: DecodeState, num_steps: int, *,
                     truncate: bool | None = None) -> tuple[DecodeState, StepResult]:
    """`num_steps` decode steps in one dispatch; results stacked as [num_steps, S]. One
    program per (num_steps, truncate): None = while a sample that may still be drawing
    asked for top-k / top-p / min-p (`_track`); True compiles that variant (warmup)."""
    num_steps = int(num_steps)
    truncate = bool(np.any(self._truncating & (self._steps_left > 0)) or truncate)
    self._steps_left -= num_steps
    return self._generate(params, decode_state, num_steps, truncate)

  def _track(self, slot: int, sampling: SlotSampling) -> None:
    """Records on the host whether slot `slot`'s new sample may need truncation, for at
    most its max_new_tokens steps (it stops no later)."""
    self._truncating[slot] = needs_truncation(sampling)
    self._steps_left[slot] = int(np.max(np.asarray(sampling.max_new_tokens)))

  # ---------------------------------------------------------------- jitted bodies

  def _logits(self, params, tokens, **kwargs):
    """The next-token logits ([B, V]) and cache: the model's, or with a logits hook
    hook(guide, hidden, logits) of the model's final hidden states and logits."""
    if self.logits_hook is None:
      return self.model.apply(params, tokens, **kwargs)
    logits, cache, hidden = self.model.apply(params.model, tokens, with_hidden=True, **kwargs)
    return self.logits_hook(params.guide, hidden, logits.astype(jnp.float32)), cache

  def _prefill_impl(self, params, tokens, true_length, pad_to, split_rows):
    self._traces["prefill"] += 1
    batch, length = tokens.shape
    cache = KVCache.create(self.model.config, batch, length)
    mask = jnp.arange(length)[None, :] < true_length[:, None]
    logits, cache = self._logits(params, tokens, attention_mask=mask, cache=cache,
                                 head_positions=true_length - 1)
    # Keys hold positions last ([.., K, D, L]), values second to last ([.., K, L, D]).
    pad = lambda x, axis: jnp.pad(x, [(0, pad_to - length) if a == x.ndim + axis else (0, 0)
                                      for a in range(x.ndim)])
    prefix = Prefix(keys=jax.tree.map(lambda k: pad(k, -1), cache.keys),
                    values=jax.tree.map(lambda v: pad(v, -2), cache.values),
                    logits=logits.astype(jnp.float32), true_length=true_length)
    if not split_rows:
      return prefix
    batch_axis = 1 if cache.stacked else 0
    return tuple(Prefix(
        keys=jax.tree.map(lambda k: jax.lax.slice_in_dim(k, r, r + 1, axis=batch_axis),
                          prefix.keys),
        values=jax.tree.map(lambda v: jax.lax.slice_in_dim(v, r, r + 1, axis=batch_axis),
                            prefix.values),
        logits=prefix.logits[r:r + 1], true_length=true_length[r:r + 1])
                 for r in range(batch))

  def _insert_impl(self, prefix, state, slot, row, sampling):
    self._traces["insert"] += 1
    length = prefix.true_length[row]
    valid_row = jnp.arange(self.cache_length) < length
    return self._start_slot(state, slot, row, prefix.keys, prefix.values, valid_row, length,
                            length, prefix.logits, sampling)

  def _start_slot(self, state, slot, row, keys, values, valid_row, end, length, logits,
                  sampling):
    """Row `row` of (keys, values) into slot `slot`, which starts sampling with its first
    token drawn from row `row` of `logits` (truncate=True: one row's sort costs little
    beside a prefill, and one program serves every request; the same draw as without)."""

    def put(buffer, rows, axis=0):  # rows[row] → buffer[slot] along the batch axis
      update = jax.lax.dynamic_index_in_dim(rows, row, axis).astype(buffer.dtype)
      start = [0] * buffer.ndim
      start[axis] = slot
      return jax.lax.dynamic_update_slice(buffer, update, start)

    cache = state.cache
    put_kv = lambda c, p: put(c, p, 1 if cache.stacked else 0)  # stacked: [layers, B, ...]
    cache = KVCache(
        keys=jax.tree.map(put_kv, cache.keys, keys),
        values=jax.tree.map(put_kv, cache.values, values),
        valid=cache.valid.at[slot].set(valid_row),
        end=cache.end.at[slot].set(end),
        length=cache.length.at[slot].set(length))
    first = draw_for_slots(jax.lax.dynamic_index_in_dim(logits, row, 0),
                           jax.tree.map(lambda x: jnp.asarray(x)[None], sampling),
                           jnp.zeros((1,), jnp.int32), jnp.full((1,), -1, jnp.int32),
                           jnp.asarray(self._newline), truncate=True)
    return DecodeState(
        cache=cache,
        next_token=state.next_token.at[slot].set(first[0][0]),
        next_sampled_logprob=state.next_sampled_logprob.at[slot].set(first[1][0]),
        next_model_logprob=state.next_model_logprob.at[slot].set(first[2][0]),
        last_token=state.last_token.at[slot].set(-1),
        generated=state.generated.at[slot].set(0),
        active=state.active.at[slot].set(True),
        sampling=jax.tree.map(lambda all_slots, one: all_slots.at[slot].set(one),
                              state.sampling, sampling))

  def _park_impl(self, state, slot):
    self._traces["park"] += 1
    cache = state.cache
    take = lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, 1 if cache.stacked else 0)
    parked = ParkedRow(keys=jax.tree.map(take, cache.keys),
                       values=jax.tree.map(take, cache.values),
                       valid=jax.lax.dynamic_slice_in_dim(cache.valid, slot, 1),
                       end=jax.lax.dynamic_slice_in_dim(cache.end, slot, 1),
                       length=jax.lax.dynamic_slice_in_dim(cache.length, slot, 1))
    # A free slot writes at position 0 again (see _generate_impl).
    cache = cache.replace(end=cache.end.at[slot].set(0), length=cache.length.at[slot].set(0))
    sampling = state.sampling.replace(keep_cache=state.sampling.keep_cache.at[slot].set(False))
    return state.replace(cache=cache, sampling=sampling), parked

  def _resume_impl(self, params, parked, state, slot, tokens, true_length, sampling):
    self._traces["resume"] += 1
    mask = jnp.arange(tokens.shape[1])[None, :] < true_length
    logits, cache = self._logits(params, tokens, attention_mask=mask, cache=parked.cache(),
                                 head_positions=(true_length - 1)[None])
    # The next token goes right after the real new ones (padding positions are invalid).
    end = parked.end[0] + true_length
    return self._start_slot(state, slot, 0, cache.keys, cache.values, cache.valid[0], end,
                            cache.length[0], logits, sampling)

  def _generate_impl(self, params, state, num_steps, truncate):
    self._traces[f"generate[{num_steps}]" + ("+truncate" if truncate else "")] += 1
    newline = jnp.asarray(self._newline)

    def step(state, _):
      s = state.sampling
      tokens = state.next_token  # drawn from the logits of the forward before
      emitted = state.active
      stopped = emitted & jnp.any(tokens[:, None] == s.stop_token_ids, axis=-1)
      generated = state.generated + emitted.astype(jnp.int32)
      finished = emitted & (stopped | (generated >= s.max_new_tokens))
      out = self._logits(params, tokens[:, None], cache=state.cache,
                         head_positions=jnp.zeros_like(tokens), with_routes=self.record_routes)
      logits, cache = out[:2]
      routes = out[2][:, 0] if self.record_routes else None  # of the token `out` read
      active = state.active & ~finished
      # Free slots write their (ignored) token at slot 0, so they never widen the span of
      # cache that decode attention reads (`cached_attention`'s num_used). A finished
      # sample that keeps its cache (until `park`) holds its end instead: its ignored
      # writes land one past its tokens, which a continuation overwrites.
      held = s.keep_cache & ~active
      keep = lambda new, old: jnp.where(active | (held & emitted), new,
                                        jnp.where(held, old, 0))
      cache = cache.replace(end=keep(cache.end, state.cache.end),
                            length=keep(cache.length, state.cache.length))
      last_token = jnp.where(emitted, tokens, state.last_token)
      # The token after, from the fresh logits: what the next step emits.
      drawn = draw_for_slots(logits, s, generated, last_token, newline, truncate=truncate)
      new_state = DecodeState(cache=cache, next_token=drawn[0], next_sampled_logprob=drawn[1],
                              next_model_logprob=drawn[2], last_token=last_token,
                              generated=generated, active=active, sampling=s)
      return new_state, StepResult(tokens=tokens, sampled_logprobs=state.next_sampled_logprob,
                                   model_logprobs=state.next_model_logprob, emitted=emitted,
                                   finished=finished, stopped=stopped, routes=routes)

    return jax.lax.scan(step, state, None, length=num_steps)
