"""Multi-turn episodes, token-in/token-out (rollout.mode = "multi_turn").

An episode is a prompt, then model turns and the environment's observations in turn:

    prompt | model turn 1 | observation 1 | model turn 2 | ... | model turn n

A model turn ends at EOS (which also ends the episode), at `env.turn_end` or at the turn
cap (`rollout.max_new_tokens`); the environment (`rlhf_jax.envs.Environment`, in killable
workers) gets its decoded text and answers with an observation, a reward and `done`. The
episode ends at `done`, EOS, `env.max_turns` model turns, a failing environment, or when
the row's budget (`env.max_tokens` after the prompt) has no room for another turn.

Token-in/token-out: the row is exactly the tokens the sampler drew, each observation
tokenised once and appended as tokens. Model text is never encoded again (decoding a turn
and encoding the conversation again can merge tokens across a turn boundary, so the loss
would see other tokens than the sampler drew). The loss mask is 1 on model tokens only;
the sampler's log-probs and versions are those of model tokens; GAE skips the observation
tokens (masked positions carry V and A across, `kernels.gae`).

Episodes run in lockstep: every live episode's turn t is one `Sampler.generate` call (each
episode one request, sent as the conversation so far), then one batch of environment
steps in the workers.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.data import Example
from rlhf_jax.envs import EnvironmentRunner
from rlhf_jax.envs import observations
from rlhf_jax.models.moe import NOT_RECORDED
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.rollout.base import StreamRollout
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import token_versions
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling.protocol import ReportsMetrics
from rlhf_jax.sampling.protocol import find_extra
from rlhf_jax.sandbox.reward_values import finite_in_float32


@dataclasses.dataclass
class Episode:
  """One episode's row as it grows (`tokens` and the lists beside it: after the prompt)."""
  example: Example
  prompt_ids: list[int]
  index: int = 0  # its place in the step (its sampling seeds derive from it)
  env: Any = None
  tokens: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  # In order: {"role": "assistant" | "environment", "text": ..., "token_ids": [...]}.
  turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  # Per turn, the experts a mixture-of-experts sampler routed its tokens to ([n, L, k]),
  # or None (observations, and a sampler that records none).
  routes: list[Any] = dataclasses.field(default_factory=list)
  # Per environment step: (column of the model turn's last token, its reward).
  step_rewards: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  failure: str = ""
  failure_kind: str = ""  # "<phase>/<kind>": its env/failures/... metric
  reward_failure: str = ""  # why its last turn's scoring failed (set by `score`)
  truncated: bool = False
  over: bool = False
  cut_chars: int = 0  # characters of an observation cut to the row's budget
  escaped: int = 0  # control texts escaped in its observations

  def append(self, role: str, ids: Sequence[int], text: str, logprobs: Sequence[float],
             versions: Sequence[int], routes: Any = None) -> None:
    """Appends one turn's tokens (trained on when the role is the assistant's), with the
    sampler's routes of a model turn ([n, L, k], or None)."""
    ids = [int(t) for t in ids]
    self.routes.append(routes)
    self.tokens += ids
    self.loss_mask += [int(role == "assistant")] * len(ids)
    self.logprobs += [float(x) for x in logprobs]
    self.versions += [int(v) for v in versions]
    self.turns.append({"role": role, "text": text, "token_ids": ids})

  def route_rows(self) -> np.ndarray | None:
    """The episode's routes, one [L, k] row per token ([len(tokens), L, k]): the sampler's
    on model turns, NOT_RECORDED on observations (the trainer's forward routes those
    live, as its prefill of them did); None when no turn has routes."""
    recorded = [np.asarray(r) for r in self.routes if r is not None]
    if not recorded:
      return None
    shape, dtype = recorded[0].shape[1:], recorded[0].dtype
    rows = [np.asarray(r, dtype) if r is not None
            else np.full((len(t["token_ids"]),) + shape, NOT_RECORDED, dtype)
            for r, t in zip(self.routes, self.turns)]
    return np.concatenate(rows) if rows else None

  def last_action(self) -> list[int]:
    """The token ids of the last model turn ([] before the first: an episode that ended
    at its reset)."""
    return next((t["token_ids"] for t in reversed(self.turns) if t["role"] == "assistant"),
                [])

  def end(self, failure: str = "", kind: str = "") -> None:
    """Ends the episode (with a failure reason and its kind when one is given)."""
    self.over = True
    if failure and not self.failure:
      self.failure, self.failure_kind = failure, kind or "other"


class MultiTurnRollout(StreamRollout):
  """`prompts_per_step` groups of G episodes per step (see the module docstring).

  Args:
    generator: its sampler, scorer (the task's verifier), tokenizer, training sampling
      parameters (temperature, ...; `max_new_tokens`: the turn cap) and seeds.
    stream: the resumable prompt stream.
    runner: the environments' workers.
    prompts_per_step: groups per step.
    group_size: G, episodes per prompt.
    max_turns: most model turns per episode.
    max_tokens: the row's budget after the prompt (the batch's response columns).
    reward_placement: "sum" (the env's rewards summed into the episode's score) or "turn"
      (each at the last token of the model turn it answers, as step rewards).
    verifier: add the verifier's score of the last model turn (and take its verdict as
      the episode's correctness; without it, correct means a positive env reward).
    turn_end_id: a token that ends a model turn without ending the episode, or None.
    failure_score: the score of an episode whose environment failed.
    max_chars_per_token: an observation may have this many characters per token left in
      the row; the worker cuts a longer one (envs/observations.py).
  """

  def __init__(self, generator: GroupGenerator, stream, runner: EnvironmentRunner, *,
               prompts_per_step: int, group_size: int, max_turns: int, max_tokens: int,
               reward_placement: str = "sum", verifier: bool = True,
               turn_end_id: int | None = None, failure_score: float = -1.0,
               max_chars_per_token: int = 16):
    self.generator = generator
    self.stream = stream
    self.runner = runner
    self.prompts_per_step = prompts_per_step
    self.group_size = group_size
    self.max_turns = max_turns
    self.max_tokens = max_tokens
    self.reward_placement = reward_placement
    self.verifier = verifier
    self.failure_score = failure_score
    self.max_chars_per_token = max_chars_per_token
    self.control = observations.control_pattern(generator.tokenizer)
    eos = generator.tokenizer.eos_id
    self.stop_ids = (eos,) if turn_end_id is None else (eos, turn_end_id)
    self.turn_end = ("" if turn_end_id is None else
                     generator.tokenizer.decode([turn_end_id], skip_special_tokens=False))

  # ------------------------------------------------------------------ episodes

  def run_episodes(self, examples: Sequence[Example], *, group_size: int | None = None,
                   sampling: SamplingParams | None = None,
                   seed: int | None = None) -> list[Episode]:
    """`group_size` (default G) episodes per example (adjacent), run to their end.

    Training draws the next seed and samples with the training parameters; evaluation
    passes its own (greedy, say) and a seed, leaving the training seeds untouched."""
    group_size = self.group_size if group_size is None else group_size
    sampling = self.generator.sampling if sampling is None else sampling
    seed = self.generator.next_seed() if seed is None else seed
    episodes = [Episode(example=e, prompt_ids=self.generator.encode(e), index=i)
                for i, e in enumerate(e for e in examples for _ in range(group_size))]
    started = self.runner.start([e.example for e in episodes],
                                [self.max_chars(e) for e in episodes])
    for episode, outcome in zip(episodes, started):
      if outcome.failure:
        episode.end(f"env reset: {outcome.failure}", f"reset/{outcome.kind}")
      else:
        episode.env = outcome.env
        self.observe(episode, outcome.result, cut=outcome.cut)
    for turn in range(self.max_turns):
      live = [e for e in episodes if not e.over]
      if not live:
        break
      self.model_turn(live, sampling, seed, turn)
      stepping = [e for e in live if not e.failure]
      outcomes = self.runner.step([e.env for e in stepping],
                                  [e.turns[-1]["text"] for e in stepping],
                                  [self.max_chars(e) for e in stepping])
      for episode, outcome in zip(stepping, outcomes):
        self.after_step(episode, outcome, last_turn=turn == self.max_turns - 1)
    return episodes

  def model_turn(self, live: list[Episode], base: SamplingParams, seed: int,
                 turn: int) -> None:
    """Samples every live episode's next model turn with `base` (one request each, sent
    as the conversation so far) and appends its tokens as sampled."""
    # A turn that may be continued keeps its KV cache: the next turn prefills only the
    # observation (sampling/engine/prefix_cache.py); the tokens are the same either way.
    params = [dataclasses.replace(
        base, n=1, stop_token_ids=self.stop_ids, keep_cache=turn < self.max_turns - 1,
        seed=(seed + 1_000_003 * e.index + 7919 * turn) % 2**31,
        max_new_tokens=min(base.max_new_tokens, self.max_tokens - len(e.tokens)))
        for e in live]
    out = self.generator.sampler.generate([e.prompt_ids + e.tokens for e in live], params)
    tokenizer = self.generator.tokenizer
    for episode, (completion,) in zip(live, out):
      ids = list(completion.token_ids)
      episode.append("assistant", ids, tokenizer.decode(ids), completion.model_logprobs,
                     token_versions(completion), routes=completion.routes)
      if completion.finish_reason not in ("stop", "length"):
        episode.end(f"sampler: {completion.finish_reason} {completion.error}".strip(),
                    f"sampler/{completion.finish_reason}")
      elif ids and ids[-1] == tokenizer.eos_id:
        episode.over = True  # the model ended the conversation (the env still scores it)
      elif len(episode.tokens) >= self.max_tokens:
        episode.truncated = episode.over = True

  def after_step(self, episode: Episode, outcome, *, last_turn: bool) -> None:
    """Records the env's answer to the last model turn; appends its observation unless
    the episode ends here."""
    if outcome.failure:
      episode.env = None
      episode.end(f"env step: {outcome.failure}", f"step/{outcome.kind}")
      return
    episode.env = outcome.env
    episode.step_rewards.append((len(episode.tokens) - 1, outcome.result.reward))
    if outcome.result.done or last_turn:
      episode.over = True
    if not episode.over:
      self.observe(episode, outcome.result.observation, outcome.result.role, outcome.cut)

  def max_chars(self, episode: Episode) -> int:
    """The most characters `episode`'s next observation may have: the tokens left in its
    row (one kept for a model token) × `max_chars_per_token`."""
    return max(0, self.max_tokens - len(episode.tokens) - 1) * self.max_chars_per_token

  def observe(self, episode: Episode, text: str, role: str = "", cut: int = 0) -> None:
    """Appends an observation (its control text escaped; rendered as a `role` turn by the
    chat template when a role is given), tokenised once; an observation that leaves no
    room for a model token ends the episode as truncated, without it. One the worker cut
    (`cut` characters), or longer than `max_chars`, is not tokenised at all."""
    if not text and not role:
      return
    if cut or len(text) > self.max_chars(episode):
      episode.cut_chars = cut or len(text) - self.max_chars(episode)
      episode.truncated = True
      episode.end()
      return
    tokenizer, observation = self.generator.tokenizer, text
    # Raw text too: its `<|im_end|>` or EOS text would be encoded as the real tokens.
    text, escaped = observations.escape_control_text(text, self.control)
    episode.escaped += escaped
    if role:
      text = tokenizer.turn_suffix(role, text, turn_end=self.turn_end,
                                   template_kwargs=self.generator.prompts.template_kwargs)
      if self.turn_end and episode.tokens and episode.tokens[-1] != self.stop_ids[-1]:
        text = self.turn_end + text  # the turn hit its cap: close it as the template does
    try:
      ids = tokenizer.encode(text)
    except Exception as error:  # pylint: disable=broad-except
      # A tool's output the tokenizer cannot encode (a character tokenizer has no UNK)
      # ends this episode as failed, not the run.
      episode.end(f"observation: the tokenizer cannot encode {observation[:40]!r}: {error}",
                  "observation/unencodable")
      return
    if len(episode.tokens) + len(ids) >= self.max_tokens:
      episode.truncated = True
      episode.end()
      return
    version = episode.versions[-1] if episode.versions else 0
    episode.append("environment", ids, text, [0.0] * len(ids), [version] * len(ids))

  # ------------------------------------------------------------------ the step's batch

  def collect(self) -> Rollouts:
    """Runs one step's episodes, scores them and packs their rows."""
    started, before = time.perf_counter(), self.prefill_counts()
    episodes = self.run_episodes(self.stream.take(self.prompts_per_step))
    scores, correct, failures = self.score(episodes)
    rollouts = pack_episodes(episodes, scores, prompt_length=self.generator.prompt_length,
                             response_length=self.max_tokens,
                             pad_id=self.generator.tokenizer.pad_id,
                             group_size=self.group_size,
                             turn_rewards=self.reward_placement == "turn")
    rollouts.correct, rollouts.failures = correct, failures
    rollouts.row_failures = [e.failure or e.reward_failure for e in episodes]  # one row each
    rollouts.metrics.update(episode_metrics(episodes, time.perf_counter() - started))
    rollouts.metrics.update(observations.failure_metrics(
        [(e.failure_kind, e.failure) for e in episodes if e.failure], len(episodes)))
    after = self.prefill_counts()
    if before and after:  # the sampler reports them (an in-process scheduler)
      rollouts.metrics.update({f"env/{k}": after[k] - before[k] for k in after})
    return rollouts

  def prefill_counts(self) -> dict[str, float]:
    """The sampler's prompt tokens prefilled and taken from kept caches so far ({} from
    a sampler that does not count them)."""
    reporter = find_extra(self.generator.sampler, ReportsMetrics)
    counts = reporter.metrics() if reporter is not None else {}
    return {k: counts[k] for k in ("prefilled_tokens", "reused_tokens") if k in counts}

  def score(self, episodes: list[Episode], scorer: Scorer | None = None
            ) -> tuple[list[float], list[bool], list[str]]:
    """Per episode: its score (the verifier's of the last model turn, plus the env's
    rewards with placement 'sum'), correctness and failure reason. `scorer`: the
    verifier (default: the training scorer; held-out evaluation passes its own)."""
    env_sums = [sum(r for _, r in e.step_rewards) for e in episodes]
    if self.verifier:
      scorer = self.generator.scorer if scorer is None else scorer
      decode = self.generator.tokenizer.decode
      scored = scorer.score([e.example for e in episodes],
                            [Completion(decode(e.last_action()), e.last_action())
                             for e in episodes])
      verdicts, base, reasons = scored.correct, scored.scores, scored.failures
    else:
      count = len(episodes)
      verdicts, base, reasons = [s > 0 for s in env_sums], [0.0] * count, [""] * count
    scores, correct, failures = [], [], []
    for episode, env_sum, verdict, score, reason in zip(episodes, env_sums, verdicts, base,
                                                        reasons):
      total = score + (env_sum if self.reward_placement == "sum" else 0.0)
      if not episode.failure and not finite_in_float32(total):
        episode.end(f"reward: the episode's score {total!r} is not finite in float32",
                    "reward/non_finite")
      if episode.failure:
        scores.append(self.failure_score)
        correct.append(False)
        failures.append(episode.failure)
        continue
      scores.append(total)
      correct.append(bool(verdict))
      episode.reward_failure = reason
      if reason:
        failures.append(reason)
    return scores, correct, failures

  def state(self) -> dict[str, Any]:
    """JSON-able state for checkpoints."""
    return {"stream": self.stream.state(), "generator": self.generator.state()}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.stream.restore(state["stream"])
    self.generator.restore(state["generator"])

  def close(self) -> None:
    """Stops the environments' workers."""
    self.runner.close()


def pack_episodes(episodes: Sequence[Episode], scores: Sequence[float], *, prompt_length: int,
                  response_length: int, pad_id: int, group_size: int,
                  turn_rewards: bool) -> Rollouts:
  """The Rollouts of episodes: one row each (the G of a prompt adjacent), the loss mask 1
  on model tokens only; with `turn_rewards` each env reward is a step reward at the last
  token of the model turn it answers. `Rollouts.transcripts` holds each row's turns."""
  batch = build_rollout_batch(
      [e.prompt_ids for e in episodes], [e.tokens for e in episodes],
      [e.logprobs for e in episodes], scores, [e.truncated for e in episodes],
      [i // group_size for i in range(len(episodes))], prompt_length=prompt_length,
      response_length=response_length, pad_id=pad_id,
      step_rewards=[e.step_rewards for e in episodes] if turn_rewards else None,
      token_versions=[e.versions for e in episodes],
      loss_masks=[e.loss_mask for e in episodes],
      routes=[e.route_rows() for e in episodes])
  return Rollouts(batch=batch, correct=[], failures=[], metrics={},
                  transcripts=[e.turns for e in episodes])


def episode_metrics(episodes: Sequence[Episode], seconds: float) -> dict[str, float]:
  """Host metrics of a step's episodes (`env/...`)."""
  count = len(episodes)
  model_turns = [sum(t["role"] == "assistant" for t in e.turns) for e in episodes]
  observed = [sum(len(t["token_ids"]) for t in e.turns if t["role"] == "environment")
              for e in episodes]
  return {"env/turns_mean": sum(model_turns) / count,
          "env/observation_tokens_mean": sum(observed) / count,
          "env/failed_fraction": sum(bool(e.failure) for e in episodes) / count,
          "env/truncated_fraction": sum(e.truncated for e in episodes) / count,
          "env/observations_cut": float(sum(bool(e.cut_chars) for e in episodes)),
          "env/control_texts_escaped": float(sum(e.escaped for e in episodes)),
          "env/reward_mean": sum(r for e in episodes for _, r in e.step_rewards) / count,
          "time_episodes": seconds}
