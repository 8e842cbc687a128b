"""Sampling and scoring groups of responses: what every rollout mode shares.

`GroupGenerator` turns examples into scored `Group`s (G samples per prompt) with
any `Sampler` and `Scorer`; `pack_batch` turns rows of responses into the
fixed-shape `RolloutBatch` the update compiles once for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.rewards import Scores
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling.protocol import Sampler


@dataclasses.dataclass
class Group:
  """The G scored samples of one prompt."""
  example: Example
  prompt_ids: list[int]
  responses: list[list[int]]
  logprobs: list[list[float]]
  scores: list[float]
  correct: list[bool]
  truncated: list[bool]
  failures: list[str]
  # Per sample its process rewards as (response column, reward) pairs (a PRM), or None.
  step_rewards: list[list[tuple[int, float]]] | None = None
  # Per sample, per token the policy version that sampled it (`token_versions`); None:
  # version 0, the starting policy (offline data, checkpoints from before versions).
  versions: list[list[int]] | None = None
  # Per sample whether it counts in training (`Scores.scored`); None: every one does.
  scored: list[bool] | None = None
  # Per sample its tokens' experts [n, L, k] as the sampler routed them
  # (`Completion.routes`: a mixture-of-experts sampler that records them); None: none.
  routes: list[Any] | None = None

  @property
  def task(self) -> str:
    """The example's task (streams count task mixes)."""
    return self.example.task

  @property
  def version(self) -> int:
    """The oldest policy version among the tokens (its age decides staleness)."""
    return min((min(v) for v in self.versions or () if v), default=0)

  def to_json(self) -> dict:
    """The group as JSON-able data (routes as {dtype, nested lists})."""
    data = dataclasses.asdict(self)
    if self.routes is not None:
      data["routes"] = [None if r is None else {"dtype": str(np.asarray(r).dtype),
                                                 "data": np.asarray(r).tolist()}
                        for r in self.routes]
    return data

  @staticmethod
  def from_json(data: dict) -> "Group":
    """Inverse of `to_json` (checkpoints; one version per sample, as checkpoints from
    before per-token versions kept them, counts for all its tokens)."""
    versions = data.get("versions")
    if versions is not None:
      versions = [[int(v)] * len(r) if isinstance(v, int) else list(v)
                  for v, r in zip(versions, data["responses"])]
    routes = data.get("routes")
    if routes is not None:
      routes = [None if r is None else np.asarray(r["data"], r["dtype"]) for r in routes]
    return Group(**{**data, "versions": versions, "routes": routes,
                    "example": Example(**data["example"])})


@dataclasses.dataclass
class Rollouts:
  """One step's rollouts: the batch and what the metrics need from the host side.

  Attributes:
    batch: the packed RolloutBatch (NumPy arrays).
    correct: per finished response, the scorer's verdict.
    failures: the scorer's failure reasons (non-empty ones only).
    metrics: the rollout mode's own metrics (e.g. dynamic sampling's kept ratio).
    transcripts: per row its turns in order ({"role": "assistant" | "environment",
      "text", "token_ids"}), from modes with more than one turn; None: one assistant
      turn per row, the response.
    row_failures: per row "" or why its reward failed (rollouts.jsonl's "failure"), from
      modes whose rows are whole samples; None: not recorded.
  """
  batch: RolloutBatch
  correct: list[bool]
  failures: list[str]
  metrics: dict[str, float]
  transcripts: list[list[dict[str, Any]]] | None = None
  row_failures: list[str] | None = None


def token_versions(completion) -> list[int]:
  """Per token of a Completion, the policy version that sampled it: the sampler's record
  (a partial rollout, whose weights were swapped mid-sample, has tokens of both), or,
  from a sampler that records none, its first version for every token (labelling a
  token older than it is only turns a weight of exactly 1 into π_prox/π_behav ≈ 1,
  while labelling it newer would hide a stale token from the correction)."""
  if completion.token_versions:
    if len(completion.token_versions) != len(completion.token_ids):
      raise ValueError(f"a completion has {len(completion.token_versions)} token versions "
                       f"for {len(completion.token_ids)} tokens.")
    return [int(v) for v in completion.token_versions]
  return [int(completion.weights_version[0])] * len(completion.token_ids)


class GroupGenerator:
  """Samples G responses per example with a `Sampler` and scores them with a `Scorer`.

  Args:
    sampler: the in-process scheduler or a server client.
    scorer: the reward (a RewardRouter, a reward model, ...).
    prompts: the run's `data.prompts.PromptFormat` (tokenizer, prefix, chat template,
      prompt length P: a longer prompt is an error).
    sampling: the training SamplingParams (n = G); each call gets a fresh seed.
    seed: seeds the per-call sampling seeds (its state is checkpointed).
    step_end_ids: the tokens that end a step (`prm.step_end_token_ids`) when the scorer
      returns step scores, which are then placed at those tokens; None: no PRM.
  """

  def __init__(self, sampler: Sampler, scorer: Scorer, prompts: PromptFormat, *,
               sampling: SamplingParams, seed: int,
               step_end_ids: frozenset[int] | None = None):
    self.sampler = sampler
    self.scorer = scorer
    self.prompts = prompts
    self.tokenizer = prompts.tokenizer
    self.sampling = sampling
    self.rng = np.random.default_rng(seed)
    self.step_end_ids = step_end_ids

  @property
  def prompt_length(self) -> int:
    """P, the prompt width of the rows (the PromptFormat's limit)."""
    return self.prompts.prompt_length

  def encode(self, example: Example) -> list[int]:
    """Prompt token ids (`PromptFormat.encode`: prefix + rendered text); a prompt longer
    than P is an error."""
    return self.prompts.encode(example)

  def next_seed(self) -> int:
    """A fresh sampling seed."""
    return int(self.rng.integers(2**31))

  def score(self, examples: Sequence[Example], responses: Sequence[Sequence[int]]) -> Scores:
    """Decodes and scores `responses[i]` against `examples[i]` (each text carries its
    sampled ids: `rewards.scorer.Completion`)."""
    return self.scorer.score(list(examples), [Completion(self.tokenizer.decode(r), r)
                                              for r in responses])

  def generate_groups(self, examples: Sequence[Example]) -> list[Group]:
    """Samples G responses per example and scores them."""
    prompts = [self.encode(e) for e in examples]
    sampling = dataclasses.replace(self.sampling, seed=self.next_seed())
    out = self.sampler.generate(prompts, sampling)
    flat = [(example, sample) for example, samples in zip(examples, out) for sample in samples]
    scored = self.score([e for e, _ in flat], [s.token_ids for _, s in flat])
    steps = self.place_steps([s.token_ids for _, s in flat], scored)
    groups, index = [], 0
    for example, prompt, samples in zip(examples, prompts, out):
      part = slice(index, index + len(samples))
      groups.append(Group(example=example, prompt_ids=prompt,
                          responses=[s.token_ids for s in samples],
                          logprobs=[s.model_logprobs for s in samples],
                          scores=scored.scores[part], correct=scored.correct[part],
                          truncated=[s.finish_reason == "length" for s in samples],
                          failures=scored.failures[part],
                          step_rewards=None if steps is None else steps[part],
                          versions=[token_versions(s) for s in samples],
                          scored=None if scored.scored is None else scored.scored[part],
                          routes=(None if all(s.routes is None for s in samples)
                                  else [s.routes for s in samples])))
      index += len(samples)
    return groups

  def place_steps(self, responses: Sequence[Sequence[int]], scored: Scores
                  ) -> list[list[tuple[int, float]]] | None:
    """Per response (column, step score) pairs: step k's score at the token that ends
    step k (`prm.step_end_positions`); None without step scores. Extra scores or
    step ends (a PRM with another tokenizer) are dropped, pairing in order."""
    if scored.step_scores is None or self.step_end_ids is None:
      return None
    from rlhf_jax.rewards.prm import step_end_positions  # pylint: disable=import-outside-toplevel
    eos = self.tokenizer.eos_id
    return [list(zip(step_end_positions(ids, self.step_end_ids, eos), step_scores))
            for ids, step_scores in zip(responses, scored.step_scores)]

  def state(self) -> dict[str, Any]:
    """JSON-able state (the seed generator) for checkpoints."""
    return {"rng": self.rng.bit_generator.state}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.rng.bit_generator.state = state["rng"]


def pack_groups(groups: Sequence[Group], *, prompt_length: int, response_length: int,
                pad_id: int) -> Rollouts:
  """The Rollouts of whole responses: one row per sample, rows of a group adjacent;
  every token carries the policy version that sampled it."""
  rows = [(g.prompt_ids, response, lps, score, trunc, gid, steps, versions)
          for gid, g in enumerate(groups)
          for response, lps, score, trunc, steps, versions in zip(
              g.responses, g.logprobs, g.scores, g.truncated,
              g.step_rewards or [()] * len(g.responses),
              g.versions or [[0] * len(r) for r in g.responses])]
  prompts, responses, logprobs, scores, truncated, group_ids, steps, versions = (
      list(x) for x in zip(*rows))
  batch = build_rollout_batch(prompts, responses, logprobs, scores, truncated, group_ids,
                              prompt_length=prompt_length, response_length=response_length,
                              pad_id=pad_id, step_rewards=steps, token_versions=versions,
                              scored=[s for g in groups
                                      for s in (g.scored or [True] * len(g.responses))],
                              routes=[r for g in groups
                                      for r in (g.routes or [None] * len(g.responses))])
  return Rollouts(batch=batch, correct=[c for g in groups for c in g.correct],
                  failures=[f for g in groups for f in g.failures if f], metrics={},
                  row_failures=[f for g in groups for f in g.failures])
