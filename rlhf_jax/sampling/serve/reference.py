"""The reference policy on a sampling server: the trainer's frozen reference weights, kept
beside the served ones, and their per-token log-probs of the trainer's rollout rows.

A batch's reference log-probs (the KL term's log π_ref) do not depend on the weights being
trained, so the server that sampled the batch can compute them while the trainer updates
(`rollout.reference_logprobs='sampler'`, rollout/reference.py): the forward leaves the
trainer's devices, which then hold no copy of the reference either. The forward is the
trainer's own (`models.lm_head.rows_logprobs`) over the same padded rows, in the server's
compute dtype, which the trainer checks against its own (UpdateWeightsResponse.compute_dtype).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import numpy as np

from rlhf_jax.models import lm_head


class NoReferenceError(RuntimeError):
  """ReferenceLogprobs before any UpdateReference (e.g. a server that restarted)."""


# Rows are scored ROW_CHUNK at a time (fewer rows: padded to a power of two), so one
# call's memory and the number of compiled shapes are bounded whatever B is.
ROW_CHUNK = 64


def check_rows(tokens: np.ndarray, attention_mask: np.ndarray, response_mask: np.ndarray,
               vocab_size: int, max_length: int | None = None) -> None:
  """Raises ValueError naming the field when the rows are not a rollout batch's layout:
  tokens and attention_mask int [B, T], response_mask float [B, R] with 1 <= R < T, token
  ids in [0, vocab_size), T <= max_length (the server's cache_length)."""
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"tokens: must be an int array [B, T]; got {tokens.dtype}"
                     f"{list(tokens.shape)}.")
  if attention_mask.shape != tokens.shape or not np.issubdtype(attention_mask.dtype,
                                                               np.integer):
    raise ValueError(f"attention_mask: must be int {list(tokens.shape)} like tokens; got "
                     f"{attention_mask.dtype}{list(attention_mask.shape)}.")
  if (response_mask.ndim != 2 or response_mask.shape[0] != tokens.shape[0]
      or not 1 <= response_mask.shape[1] < tokens.shape[1]
      or response_mask.dtype != np.float32):
    raise ValueError(f"response_mask: must be float32 [{tokens.shape[0]}, R] with 1 <= R < "
                     f"{tokens.shape[1]}; got {response_mask.dtype}"
                     f"{list(response_mask.shape)}.")
  if max_length is not None and tokens.shape[1] > max_length:
    raise ValueError(f"tokens: rows of {tokens.shape[1]} tokens; this server takes at most "
                     f"{max_length} (its cache_length).")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"tokens: ids must lie in [0, {vocab_size}); got "
                     f"[{tokens.min()}, {tokens.max()}].")


class ReferencePolicy:
  """A server's reference weights and their log-prob forward (compiled once per row shape).

  Args:
    model: the served model (its numerics: the server's compute dtype).
    max_length: the longest row (tokens per row) it scores; None: any.
  """

  def __init__(self, model, max_length: int | None = None):
    self.model = model
    self.max_length = max_length
    self.params: Any = None
    self.lock = threading.Lock()  # a load never lands mid-forward
    self._forward = jax.jit(functools.partial(lm_head.rows_logprobs, model))

  def load(self, params: Any) -> None:
    """Keeps `params` (already on the server's devices) as the reference."""
    with self.lock:
      self.params = params

  def logprobs(self, tokens: np.ndarray, attention_mask: np.ndarray,
               response_mask: np.ndarray) -> np.ndarray:
    """log π_ref of each response token, [B, R] float32, 0 off `response_mask`.

    Raises:
      ValueError: a malformed row, naming the field (`check_rows`).
      NoReferenceError: no weights loaded yet (`load`).
    """
    check_rows(tokens, attention_mask, response_mask, self.model.config.vocab_size,
               self.max_length)
    with self.lock:
      if self.params is None:
        raise NoReferenceError("no reference weights on this server: send them with "
                               "UpdateReference first.")
      padded = bucketed(tokens, attention_mask, response_mask)
      rows, width = response_mask.shape
      out = [np.asarray(jax.device_get(self._forward(self.params, *(x[i:i + ROW_CHUNK]
                                                                   for x in padded))))
             for i in range(0, padded[0].shape[0], ROW_CHUNK)]
      return np.concatenate(out)[:rows, :width].astype(np.float32)


def _power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def bucketed(tokens: np.ndarray, attention_mask: np.ndarray, response_mask: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The rows padded to bucketed shapes, so requests of any size share few programs:
  prompt and response widths to powers of two (prompt columns masked on the left, where
  the layout pads prompts; response columns on the right), rows to a power of two below
  ROW_CHUNK and a multiple of it above. Padding is masked out: the real rows' log-probs
  are unchanged, and they sit in out[:B, :R]."""
  rows, total = tokens.shape
  response = response_mask.shape[1]
  prompt = total - response
  batch = (_power_of_two(rows) if rows <= ROW_CHUNK else -(-rows // ROW_CHUNK) * ROW_CHUNK)
  left, right = _power_of_two(prompt) - prompt, _power_of_two(response) - response
  widths = ((0, batch - rows), (left, right))
  return (np.pad(tokens.astype(np.int32), widths),
          np.pad(attention_mask.astype(np.int32), widths),
          np.pad(response_mask, ((0, batch - rows), (0, right))))
