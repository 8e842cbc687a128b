"""Per-request sampling parameters, checked on the host before anything runs.

`SamplingParams` is what a caller (the trainer, the server, a notebook) fills
in; `Engine.insert` turns one sample of it into fixed-dtype per-slot arrays, so
mixing requests with different parameters in one decode batch never
recompiles. Every check names the offending field.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

# FIRE defaults: Chen et al., "Flaming-hot Initiation with Regular Execution
# Sampling for Large Language Models" (arXiv:2410.21236): the first response
# token at a very high temperature, made safe by top-k.
FIRE_TEMPERATURE = 30.0
FIRE_TOP_K = 16
# Most stop_token_ids or candidate_token_ids per request (a judge's verdict tokens are a
# handful): each sample carries the candidates' log-probs back.
MAX_TOKEN_LIST = 256


@dataclasses.dataclass(frozen=True)
class FireSchedule:
  """FIRE: a hot first token, then the request's regular parameters.

  Attributes:
    temperature: temperature of the hot step (paper default 30).
    top_k: top-k of the hot step (paper default 16; 0 = none, not advised).
    every_line: also take a hot step at the first token of every new line (the
      token after one whose text ends with a newline), the paper's per-line
      variant for step-by-step solutions.
  """
  temperature: float = FIRE_TEMPERATURE
  top_k: int = FIRE_TOP_K
  every_line: bool = False

  def __post_init__(self):
    _check_number("fire.temperature", self.temperature, low=0.0, low_open=True)
    _check_int("fire.top_k", self.top_k, low=0)
    if not isinstance(self.every_line, bool):
      raise ValueError(f"fire.every_line={self.every_line!r} must be a bool.")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample one request's continuation(s).

  Truncations are applied in HF's order: temperature, then top-k, then top-p
  on what top-k kept, then min-p.

  Attributes:
    temperature: softmax temperature; 0 means greedy (argmax).
    top_k: keep the k most likely tokens (0 = no limit).
    top_p: keep the smallest set of tokens whose probability mass reaches
      top_p (1 = no limit).
    min_p: drop tokens less likely than min_p × the most likely one (0 = none).
    max_new_tokens: the most tokens generated per sample.
    stop_token_ids: generation ends after emitting any of these (e.g. EOS); the
      stop token is part of the response.
    n: independent samples of the prompt; they share one prefill.
    seed: PRNG seed; the same seed gives the same tokens whatever else is in
      the batch. None: the scheduler draws one and reports it.
    fire: a FireSchedule, or None for regular sampling at every position.
    candidate_token_ids: tokens whose log-probabilities at the first generated position
      (under the model at temperature 1, read from the prefill logits) each sample
      reports in `Completion.candidate_logprobs`: a generative judge's verdict
      probabilities without parsing its text (rewards/genrm.py).
    keep_cache: keep each finished sample's KV cache (the scheduler's `PrefixCache`), so
      that a later request whose prompt extends the sample's prompt and tokens prefills
      only the new tokens: the next turn of a multi-turn episode. The tokens drawn are
      the same either way.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  max_new_tokens: int = 256
  stop_token_ids: Sequence[int] = ()
  n: int = 1
  seed: int | None = None
  fire: FireSchedule | None = None
  candidate_token_ids: Sequence[int] = ()
  keep_cache: bool = False

  def __post_init__(self):
    _check_number("temperature", self.temperature, low=0.0)
    _check_int("top_k", self.top_k, low=0)
    _check_number("top_p", self.top_p, low=0.0, low_open=True, high=1.0)
    _check_number("min_p", self.min_p, low=0.0, high=1.0, high_open=True)
    _check_int("max_new_tokens", self.max_new_tokens, low=1)
    _check_int("n", self.n, low=1)
    if self.seed is not None:
      _check_int("seed", self.seed, low=0, high=2**32 - 1)
    for name in ("stop_token_ids", "candidate_token_ids"):
      if len(getattr(self, name)) > MAX_TOKEN_LIST:
        raise ValueError(f"{name} has {len(getattr(self, name))} ids; at most "
                         f"{MAX_TOKEN_LIST}.")
    if isinstance(self.stop_token_ids, (str, bytes)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0
        for t in self.stop_token_ids):
      raise ValueError(f"stop_token_ids={self.stop_token_ids!r} must be a sequence of "
                       "non-negative token ids.")
    object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
    if isinstance(self.candidate_token_ids, (str, bytes)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0
        for t in self.candidate_token_ids):
      raise ValueError(f"candidate_token_ids={self.candidate_token_ids!r} must be a sequence "
                       "of non-negative token ids.")
    object.__setattr__(self, "candidate_token_ids",
                       tuple(int(t) for t in self.candidate_token_ids))
    if not isinstance(self.keep_cache, bool):
      raise ValueError(f"keep_cache={self.keep_cache!r} must be a bool.")
    if self.fire is not None and not isinstance(self.fire, FireSchedule):
      raise ValueError(f"fire={self.fire!r} must be a FireSchedule or None.")

  def replace(self, **changes) -> "SamplingParams":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)

  def check_against(self, *, vocab_size: int, max_stop_tokens: int) -> None:
    """Checks the fields that depend on the engine; raises ValueError naming the field."""
    for name, tokens in (("stop_token_ids", self.stop_token_ids),
                         ("candidate_token_ids", self.candidate_token_ids)):
      for token in tokens:
        if token >= vocab_size:
          raise ValueError(f"{name} contains {token}, outside the vocabulary "
                           f"(size {vocab_size}).")
    if len(self.stop_token_ids) > max_stop_tokens:
      raise ValueError(f"stop_token_ids has {len(self.stop_token_ids)} ids; this engine "
                       f"takes at most {max_stop_tokens} (Engine(max_stop_tokens=...)).")
    for name, value in (("top_k", self.top_k),
                        ("fire.top_k", None if self.fire is None else self.fire.top_k)):
      if value is not None and value > vocab_size:
        raise ValueError(f"{name}={value} exceeds the vocabulary size {vocab_size}.")


def prompt_seed(seed: int, index: int) -> int:
  """The seed of prompt `index` of a batch sampled with one seeded SamplingParams: the
  seed itself for the first prompt (a one-prompt call samples as `submit` does), a 31-bit
  hash of (seed, index) for the others, so prompts of one call draw independent numbers."""
  if index == 0:
    return seed
  return int(np.random.SeedSequence([seed, index]).generate_state(1)[0] >> 1)


def per_prompt(prompts: Sequence, sampling: "SamplingParams | Sequence[SamplingParams]"
               ) -> list[SamplingParams]:
  """One SamplingParams per prompt: the given list (same length), or `sampling` for
  every prompt, its seed (when set) replaced by `prompt_seed(seed, k)` for prompt k.

  Without that, sample i of every prompt would draw the same uniform numbers, so their
  outcomes would be correlated across prompts: a batch of 256 prompts × 4 samples would
  estimate an accuracy with the variance of a handful of samples.
  """
  if isinstance(sampling, SamplingParams):
    if sampling.seed is None:
      return [sampling] * len(prompts)
    return [dataclasses.replace(sampling, seed=prompt_seed(sampling.seed, k))
            for k in range(len(prompts))]
  samplings = list(sampling)
  if len(samplings) != len(prompts):
    raise ValueError(f"got {len(samplings)} SamplingParams for {len(prompts)} prompts.")
  return samplings


def _check_number(name, value, *, low=None, high=None, low_open=False, high_open=False):
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"{name}={value!r} must be a number.")
  if value != value:
    raise ValueError(f"{name} is NaN.")
  if value in (float("inf"), float("-inf")):
    raise ValueError(f"{name}={value!r} must be finite.")
  if low is not None and (value < low or (low_open and value == low)):
    raise ValueError(f"{name}={value!r} must be {'>' if low_open else '>='} {low}.")
  if high is not None and (value > high or (high_open and value == high)):
    raise ValueError(f"{name}={value!r} must be {'<' if high_open else '<='} {high}.")


def _check_int(name, value, *, low=None, high=None):
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"{name}={value!r} must be an integer.")
  _check_number(name, value, low=low, high=high)
