"""The test suites' shared fakes: a sampler, a scorer, a tokenizer, a rollout and an
environment. Each is small, deterministic and satisfies the library's protocol for its
part (tests/test_protocols.py checks it), so a suite writes none of its own:

    FakeSampler     sampling.protocol.Sampler    answers `respond(prompt, sampling, i)`
    FakeScorer      rewards.Scorer               score `score_of(example, response)`
    fake_tokenizer  models.Tokenizer             characters of a small alphabet
    FakeRollout     rollout.base.Rollout         one row per batch, through a sampler
    FakeEnvironment envs.base.Environment        counts down `turns`, then done
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rlhf_jax import models
from rlhf_jax.batch import build_rollout_batch
from rlhf_jax.envs.base import StepResult
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.sampling.params import SamplingParams
from rlhf_jax.sampling.params import per_prompt
from rlhf_jax.sampling.protocol import Completion


def _first_token(prompt, sampling, index) -> list[int]:
  return [len(prompt) + index]


class FakeSampler:
  """A `Sampler` whose sample `i` of `prompt` is `respond(prompt, sampling, i)` (token
  ids), `sampling.n` samples per prompt, every token with the given log-probs and the
  version of the last `update_params`. Records every call.

  Attributes:
    version: the weights version it holds.
    calls: per `generate` call, (its prompts, the version that sampled them).
    updates / cancelled: the `update_params` versions and `cancel` arguments.
    closed: whether `close` was called.
  """

  def __init__(self, respond: Callable[[list[int], SamplingParams, int], list[int]] =
               _first_token, *, sampled_logprob: float = -1.0, model_logprob: float = -1.0,
               finish_reason: str = "stop", version: int = 0):
    self.respond, self.version = respond, version
    self.sampled_logprob, self.model_logprob = sampled_logprob, model_logprob
    self.finish_reason = finish_reason
    self.calls: list[tuple[list[list[int]], int]] = []
    self.updates: list[int] = []
    self.cancelled: list[tuple[str, int | None]] = []
    self.closed = False

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams()
               ) -> list[list[Completion]]:
    """Per prompt its `n` completions (see the class docstring)."""
    prompts = [list(p) for p in prompts]
    self.calls.append((prompts, self.version))
    out = []
    for k, (prompt, params) in enumerate(zip(prompts, per_prompt(prompts, sampling))):
      group = []
      for i in range(params.n):
        tokens = list(self.respond(prompt, params, i))
        group.append(Completion(
            request_id=f"fake-{len(self.calls)}-{k}", sample_index=i, prompt_ids=prompt,
            token_ids=tokens, sampled_logprobs=[self.sampled_logprob] * len(tokens),
            model_logprobs=[self.model_logprob] * len(tokens),
            finish_reason=self.finish_reason, seed=0,
            weights_version=(self.version, self.version),
            token_versions=[self.version] * len(tokens)))
      out.append(group)
    return out

  def update_params(self, params: Any, version: int) -> None:
    """Holds `version` from now on (the weights themselves are not used)."""
    self.version = version
    self.updates.append(version)

  def cancel(self, request_id: str, sample_index: int | None = None) -> None:
    """Records the cancel (every call has finished already)."""
    self.cancelled.append((request_id, sample_index))

  def close(self) -> None:
    """Records the close."""
    self.closed = True


class FakeScorer(ScorerBase):
  """A `Scorer`: each response's score is `score_of(example, response)` and it is correct
  when `correct_if(score)`; with `raises`, `score` raises it (a scorer with a bug);
  `tasks` (None: any) are the tasks `check_tasks` accepts.

  Attributes:
    seen: samples scored so far.
    calls: per `score` call, its (examples, responses).
  """

  def __init__(self, score_of: Callable[[Any, str], float] = lambda example, response:
               float(len(response)), *, correct_if: Callable[[float], bool] = lambda s: True,
               raises: BaseException | None = None, tasks: Sequence[str] | None = None):
    self.score_of, self.correct_if, self.raises = score_of, correct_if, raises
    self.tasks = None if tasks is None else set(tasks)
    self.seen = 0
    self.calls: list[tuple[list[Any], list[str]]] = []

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """ValueError naming the first task outside `tasks` (when given)."""
    unknown = sorted(set(tasks) - self.tasks) if self.tasks is not None else []
    if unknown:
      raise ValueError(f"no scorer for task {unknown[0]!r}")

  def score(self, examples: Sequence[Any], responses: Sequence[str]) -> Scores:
    """See the class docstring."""
    self.calls.append((list(examples), list(responses)))
    if self.raises is not None:
      raise self.raises
    scores = [float(self.score_of(e, r)) for e, r in zip(examples, responses)]
    self.seen += len(scores)
    return Scores(scores, [bool(self.correct_if(s)) for s in scores], [""] * len(scores))


ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 +-*=:.?\n"


def fake_tokenizer(alphabet: str = ALPHABET) -> models.Tokenizer:
  """A `models.Tokenizer` with one token per character of `alphabet` (and the special
  tokens): built in milliseconds, no training, every text of the alphabet round-trips."""
  return models.build_character_tokenizer(alphabet)


class FakeRollout:
  """A `Rollout` whose batch n is one row: prompt [1], the response `sampler` gives it
  (a FakeSampler's default: none), its score the batch's index; the rows' token
  versions are the sampler's version. Records every call of the seam but `collect`.

  Attributes:
    position: batches collected (its `state`).
    step: the last `set_step`.
    calls: the names of the seam's calls, in order.
  """

  def __init__(self, sampler=None, *, task: str = "arith", response_length: int = 4):
    self.sampler = FakeSampler() if sampler is None else sampler
    self.task, self.response_length = task, response_length
    self.position, self.step = 0, None
    self.calls: list[str] = []
    self.closed = False

  def collect(self) -> Rollouts:
    """One row (see the class docstring)."""
    (completion,), = self.sampler.generate([[1]], SamplingParams(n=1))
    tokens = completion.token_ids[:self.response_length]
    version = completion.weights_version[0]
    batch = build_rollout_batch(
        [[1]], [tokens], [completion.model_logprobs[:len(tokens)]], [float(self.position)],
        [False], [0], prompt_length=1, response_length=self.response_length, pad_id=0,
        token_versions=[[version] * len(tokens)])
    self.position += 1
    return Rollouts(batch=batch, correct=[True], failures=[],
                    metrics={"version": float(version)})

  def set_step(self, step: int) -> None:
    """Records the step."""
    self.calls.append("set_step")
    self.step = step

  def pop_mix(self) -> dict[str, int]:
    """One example of `task` per batch."""
    self.calls.append("pop_mix")
    return {self.task: 1}

  def state(self) -> dict[str, Any]:
    """The batches collected so far."""
    self.calls.append("state")
    return {"position": self.position}

  def restore(self, state: dict[str, Any]) -> None:
    """Back to `state()`."""
    self.calls.append("restore")
    self.position = state["position"]

  def settle(self) -> None:
    """Nothing runs in the background."""
    self.calls.append("settle")

  def close(self) -> None:
    """Records the close."""
    self.calls.append("close")
    self.closed = True


class FakeEnvironment:
  """An `Environment` that answers each turn with "ok <turns left>" and ends after
  `turns` turns, with reward 1.0 on the last one. Picklable (top-level, plain state):
  `tests.fakes:FakeEnvironment` is a valid `env.factory`."""

  def __init__(self, turns: int = 2):
    self.turns = turns
    self.left = turns
    self.actions: list[str] = []

  def reset(self, example) -> str:
    """No first observation."""
    self.left, self.actions = self.turns, []
    return ""

  def step(self, action: str) -> StepResult:
    """See the class docstring."""
    self.actions.append(action)
    self.left -= 1
    done = self.left <= 0
    return StepResult(observation="" if done else f"ok {self.left}",
                      reward=1.0 if done else 0.0, done=done)
