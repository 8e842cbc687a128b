"""T-PPO's windowed generation (arXiv:2506.15050; docs/formulas.md#t-ppo).

A fixed pool of in-flight responses. Each training step every response in the
pool generates at most W more tokens (`window_tokens`) with the current policy;
a response that stops (stop token) or reaches the response cap R is finished,
scored and retired, and its place goes to a fresh sample, so the pool (and the
update's batch) keeps its size. An unfinished response continues in the next
step from where it stopped, under the weights of that step.

A continuation is sent to the sampler as a new request whose prompt is the
original prompt plus the tokens so far. Its KV cache is therefore recomputed
with the current weights: the cache of the previous window belongs to the old
policy, and reusing it would make the new tokens' log-probs disagree with the
trainer's recomputation. The re-prefill costs one prompt-length forward per
response per window, small against W decode steps.

Each step's rows are whole responses so far, with `window_start` marking the
first token generated in this step: the policy loss uses only those tokens (a
token is trained on once, in the step that sampled it, so its old log-prob is
on-policy); Extended GAE bootstraps unfinished rows from their last value
(`kernels.truncation_bootstrap_values`); the critic trains on finished rows only.
A response thus spans several policy versions: each token keeps the version of the
window that sampled it (the batch's `token_versions`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import token_versions
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.rollout.base import StreamRollout


@dataclasses.dataclass
class Trajectory:
  """One response being generated across windows.

  Attributes:
    example: the prompt's example.
    prompt_ids: the encoded prompt.
    tokens: response tokens generated so far.
    logprobs: the sampler's log π of each token (under the weights of its window).
    windows: windows generated so far.
    group: id shared by the `group_size` samples of one prompt.
    versions: the policy version that sampled each token (its window's).
  """
  example: Example
  prompt_ids: list[int]
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  windows: int = 0
  group: int = 0
  versions: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Segment:
  """One row of a T-PPO step: a response so far and what this step added.

  Attributes:
    trajectory: the response (tokens include this step's window).
    window_start: index of the first token generated this step.
    finished: it stopped or hit the cap this step.
    truncated: it hit the cap R without a stop token.
  """
  trajectory: Trajectory
  window_start: int
  finished: bool
  truncated: bool


class WindowPool:
  """The in-flight responses of T-PPO.

  Args:
    capacity: responses in flight (= rows of each step's batch).
    group_size: samples started per prompt.
    window_tokens: W, new tokens per response per step.
    max_new_tokens: R, the response cap.
    stop_token_ids: tokens that finish a response.
  """

  def __init__(self, capacity: int, *, group_size: int, window_tokens: int,
               max_new_tokens: int, stop_token_ids: Sequence[int]):
    if window_tokens < 1:
      raise ValueError(f"window_tokens={window_tokens} must be >= 1.")
    self.capacity = capacity
    self.group_size = group_size
    self.window_tokens = window_tokens
    self.max_new_tokens = max_new_tokens
    self.stop_token_ids = tuple(stop_token_ids)
    self.in_flight: list[Trajectory] = []
    # Samples of an already-taken prompt that did not fit yet (group_size > free slots).
    self.waiting: collections.deque[Trajectory] = collections.deque()
    self.groups_started = 0

  def fill(self, take: Callable[[int], list[tuple[Example, list[int]]]]) -> int:
    """Tops the pool up to `capacity` (waiting samples first, then `group_size`
    samples of each new prompt from `take(count)`); returns how many started."""
    started = 0
    free = self.capacity - len(self.in_flight)
    missing = free - len(self.waiting)
    if missing > 0:
      for example, prompt_ids in take(-(-missing // self.group_size)):
        for _ in range(self.group_size):
          self.waiting.append(Trajectory(example=example, prompt_ids=list(prompt_ids),
                                         group=self.groups_started))
        self.groups_started += 1
    while self.waiting and len(self.in_flight) < self.capacity:
      self.in_flight.append(self.waiting.popleft())
      started += 1
    return started

  def longest_prompt(self, prompt_length: int) -> int:
    """The longest request prompt this pool sends (see `longest_request_prompt`)."""
    return longest_request_prompt(prompt_length, self.max_new_tokens, self.window_tokens)

  def requests(self, base: SamplingParams, seeds: Sequence[int]
               ) -> list[tuple[list[int], SamplingParams]]:
    """(prompt, SamplingParams) of this step's window for every in-flight response.

    `base` gives the sampling settings; each request gets n = 1, its own seed and
    max_new_tokens = min(W, R − generated). FIRE's hot token applies only to a
    response's first window (its first token).
    """
    if len(seeds) != len(self.in_flight):
      raise ValueError(f"got {len(seeds)} seeds for {len(self.in_flight)} responses.")
    out = []
    for trajectory, seed in zip(self.in_flight, seeds):
      budget = min(self.window_tokens, self.max_new_tokens - len(trajectory.tokens))
      sampling = dataclasses.replace(
          base, n=1, seed=int(seed), max_new_tokens=budget,
          fire=base.fire if not trajectory.tokens else None)
      out.append((trajectory.prompt_ids + trajectory.tokens, sampling))
    return out

  def advance(self, windows: Sequence[tuple[Sequence[int], Sequence[float]]],
              versions: Sequence[int | Sequence[int]] | None = None) -> list[Segment]:
    """Appends each response's new (tokens, log-probs), sampled by policy version
    `versions[i]` (one for all its new tokens, or one per token; default 0), retires the
    finished ones, and returns the step's segments (one per response in flight)."""
    if len(windows) != len(self.in_flight):
      raise ValueError(f"got {len(windows)} windows for {len(self.in_flight)} responses.")
    versions = [0] * len(windows) if versions is None else list(versions)
    if len(versions) != len(windows):
      raise ValueError(f"got {len(versions)} versions for {len(windows)} windows.")
    segments, still = [], []
    for trajectory, (tokens, logprobs), version in zip(self.in_flight, windows, versions):
      start = len(trajectory.tokens)
      trajectory.tokens.extend(int(t) for t in tokens)
      trajectory.logprobs.extend(float(x) for x in logprobs)
      per_token = ([int(version)] * len(tokens) if np.ndim(version) == 0
                   else [int(v) for v in version])
      if len(per_token) != len(tokens):
        raise ValueError(f"got {len(per_token)} versions for {len(tokens)} new tokens.")
      trajectory.versions.extend(per_token)
      trajectory.windows += 1
      stopped = bool(tokens) and int(tokens[-1]) in self.stop_token_ids
      capped = len(trajectory.tokens) >= self.max_new_tokens
      finished = stopped or capped
      segments.append(Segment(trajectory=trajectory, window_start=start, finished=finished,
                              truncated=capped and not stopped))
      if not finished:
        still.append(trajectory)
    self.in_flight = still
    return segments

  def state(self) -> dict:
    """JSON-able state for checkpoints."""
    return {"in_flight": [dataclasses.asdict(t) for t in self.in_flight],
            "waiting": [dataclasses.asdict(t) for t in self.waiting],
            "groups_started": self.groups_started}

  def restore(self, state: dict) -> None:
    """Restores `state()`."""
    def load(t):
      # A state saved before versions were kept: its tokens count as version 0.
      versions = t.get("versions", [0] * len(t["tokens"]))
      return Trajectory(**{**t, "example": Example(**t["example"]), "versions": versions})
    self.in_flight = [load(t) for t in state["in_flight"]]
    self.waiting = collections.deque(load(t) for t in state["waiting"])
    self.groups_started = int(state["groups_started"])


def longest_request_prompt(prompt_length: int, max_new_tokens: int, window_tokens: int) -> int:
  """The longest prompt a continuation request can have: a prompt of `prompt_length`
  plus the longest unfinished response (whole windows below the cap)."""
  return prompt_length + ((max_new_tokens - 1) // window_tokens) * window_tokens


class WindowRollout(StreamRollout):
  """T-PPO's rollout mode (rollout.mode = "windows"): one window per in-flight response.

  Args:
    generator: samples (n = 1 per request here) and scores finished responses.
    stream: the resumable prompt stream.
    prompts_per_step: prompts per step; the pool holds prompts_per_step × group_size
      responses (the batch's rows).
    group_size: responses per prompt.
    window_tokens: W.
    response_length: R.
  """

  def __init__(self, generator: GroupGenerator, stream: PromptStream, *, prompts_per_step: int,
               group_size: int, window_tokens: int, response_length: int):
    self.generator = generator
    self.stream = stream
    self.response_length = response_length
    self.pool = WindowPool(prompts_per_step * group_size, group_size=group_size,
                           window_tokens=window_tokens, max_new_tokens=response_length,
                           stop_token_ids=generator.sampling.stop_token_ids)

  def collect(self) -> Rollouts:
    """Tops the pool up, generates one window per response, scores those that
    finished, and packs every in-flight response as a row."""
    pool, generator = self.pool, self.generator
    started = pool.fill(lambda n: [(e, generator.encode(e)) for e in self.stream.take(n)])
    seeds = [generator.next_seed() for _ in pool.in_flight]
    requests = pool.requests(generator.sampling, seeds=seeds)
    out = generator.sampler.generate([prompt for prompt, _ in requests],
                                     [sampling for _, sampling in requests])
    segments = pool.advance([(o[0].token_ids, o[0].model_logprobs) for o in out],
                            versions=[token_versions(o[0]) for o in out])
    done = [i for i, segment in enumerate(segments) if segment.finished]
    scored = generator.score([segments[i].trajectory.example for i in done],
                             [segments[i].trajectory.tokens for i in done])
    scores = dict(zip(done, scored.scores))
    batch = build_rollout_batch(
        [s.trajectory.prompt_ids for s in segments], [s.trajectory.tokens for s in segments],
        [s.trajectory.logprobs for s in segments],
        [scores.get(i, 0.0) for i in range(len(segments))],
        [s.truncated for s in segments], [s.trajectory.group for s in segments],
        prompt_length=generator.prompt_length, response_length=self.response_length,
        pad_id=generator.tokenizer.pad_id, window_starts=[s.window_start for s in segments],
        finished=[s.finished for s in segments],
        token_versions=[s.trajectory.versions for s in segments])
    return Rollouts(batch=batch, correct=list(scored.correct),
                    failures=[f for f in scored.failures if f],
                    metrics={"finished_responses": float(len(done)),
                             "started_responses": float(started),
                             "in_flight_responses": float(len(pool.in_flight))})

  def state(self) -> dict[str, Any]:
    """JSON-able state for checkpoints (the pool holds responses in flight)."""
    return {"stream": self.stream.state(), "generator": self.generator.state(),
            "windows": self.pool.state()}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.stream.restore(state["stream"])
    self.generator.restore(state["generator"])
    self.pool.restore(state["windows"])
