"""Routing each sample to a reward: rule verifier, GenRM, reward model (Shen et al.,
arXiv:2503.22230 §3; docs/formulas.md#hybrid-rewards).

`RoutedScorer` sends every sample down one route and keeps per-route metrics (share of
samples, mean score, failure rate). The config's `reward.route` picks a single route for
all samples, or 'hybrid': per sample the first that applies of
  verifier         the task has a rule verifier (or the code sandbox)
  function         `reward.function` is set (rewards/functions.py)
  genrm_gt         the example has a ground-truth answer (GenRM w/ GT)
  genrm_reference  the example has a reference response (GenRM w/ SFT-BoN)
  rm               the Bradley–Terry reward model
With a `monitor` (the rule verifiers), samples of model routes whose task has a
verifier are also checked, giving the true accuracy beside the proxy reward: the
measure of reward hacking.
"""

from __future__ import annotations

import collections
from typing import Callable, Mapping, Sequence

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import Scores
from rlhf_jax.rewards.scorer import failed_scores
from rlhf_jax.rewards.scorer import gather_scores
from rlhf_jax.rewards.scorer import guarded_score
from rlhf_jax.rewards.scorer import ScorerBase

ROUTES = ("verifier", "genrm_gt", "genrm_reference", "rm", "pairwise")
ROUTE_MODES = ROUTES + ("hybrid",)
# The routes a RoutedScorer may hold: reward.function's is set by its own field.
SCORER_ROUTES = ROUTES + ("function",)
HYBRID_ORDER = ("verifier", "function", "genrm_gt", "genrm_reference", "rm")


def hybrid_chooser(routes: Mapping[str, Scorer], verifier_tasks: Sequence[str], *,
                   reference_key: str = "reference") -> Callable[[Example], str]:
  """example → the first route of HYBRID_ORDER that is configured and applies
  (module docstring); '' when none does."""
  tasks = frozenset(verifier_tasks)

  def applies(route: str, example: Example) -> bool:
    if route == "verifier":
      return example.task in tasks
    if route == "genrm_gt":
      return bool(example.answer.strip())
    if route == "genrm_reference":
      reference = (example.metadata or {}).get(reference_key)
      return isinstance(reference, str) and bool(reference)
    return True

  def choose(example: Example) -> str:
    return next((r for r in HYBRID_ORDER if r in routes and applies(r, example)), "")

  return choose


class RoutedScorer(ScorerBase):
  """A `Scorer` that scores each sample with the scorer of its route.

  Args:
    routes: route name → Scorer.
    choose: example → route name ('' = none applies: a recorded failure).
    monitor: optional rule scorer; its verdicts on model-routed samples of the tasks
      in `monitor_tasks` become `reward/<route>/true_accuracy`.
    monitor_tasks: the tasks the monitor can check.
    failure_score: the reward of a sample with no route or whose scorer raised.
  """

  def __init__(self, routes: Mapping[str, Scorer], choose: Callable[[Example], str], *,
               monitor: Scorer | None = None, monitor_tasks: Sequence[str] = (),
               failure_score: float = 0.0):
    unknown = sorted(set(routes) - set(SCORER_ROUTES))
    if unknown:
      raise ValueError(f"unknown reward route(s) {unknown}; allowed: "
                       f"{', '.join(SCORER_ROUTES)}.")
    self.routes, self.choose, self.failure_score = dict(routes), choose, failure_score
    self.monitor, self.monitor_tasks = monitor, frozenset(monitor_tasks)
    self._totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

  def check_tasks(self, tasks: Sequence[str]) -> None:
    """The verifier route's check for the tasks it would get (the others take any)."""
    verifier = self.routes.get("verifier")
    if verifier is None:
      return
    routed = [t for t in tasks if self.choose(Example("", "", t)) == "verifier"]
    verifier.check_tasks(routed)

  def score(self, examples: Sequence[Example], responses: Sequence[str]) -> Scores:
    """Scores `responses[i]` against `examples[i]` on its route."""
    if len(examples) != len(responses):
      raise ValueError(f"{len(examples)} examples for {len(responses)} responses.")
    by_route = collections.defaultdict(list)
    for i, example in enumerate(examples):
      by_route[self.choose(example)].append(i)
    parts: dict[int, tuple[int, Scores]] = {}
    for route, rows in by_route.items():
      scored = self._scored(route, [examples[i] for i in rows], [responses[i] for i in rows])
      self._count(route, scored, [examples[i] for i in rows], [responses[i] for i in rows])
      parts.update({i: (position, scored) for position, i in enumerate(rows)})
    return gather_scores(parts, len(examples))

  def _scored(self, route: str, examples, responses) -> Scores:
    if not route:
      return failed_scores(len(examples), "no reward route applies (no verifier, ground "
                           "truth, reference or RM)", self.failure_score)
    return guarded_score(self.routes[route], examples, responses,
                         failure_score=self.failure_score, what=f"route {route} scorer")

  def _count(self, route: str, scored: Scores, examples, responses) -> None:
    totals = self._totals[route or "none"]
    totals["samples"] += len(examples)
    totals["score"] += float(np.sum(scored.scores))
    totals["failures"] += sum(bool(f) for f in scored.failures)
    if self.monitor is None or route == "verifier":
      return
    checked = [i for i, e in enumerate(examples) if e.task in self.monitor_tasks]
    if checked:
      truth = self.monitor.score([examples[i] for i in checked], [responses[i] for i in checked])
      totals["checked"] += len(checked)
      totals["true_correct"] += sum(truth.correct)

  def pop_metrics(self) -> dict[str, float]:
    """Per route since the last call: share of samples, mean score, failure rate and,
    with a monitor, the true accuracy of its checked samples; plus the routes'
    own scorers' metrics."""
    out = {}
    samples = sum(t["samples"] for t in self._totals.values())
    for route, t in sorted(self._totals.items()):
      out[f"reward/{route}/share"] = t["samples"] / samples
      out[f"reward/{route}/score_mean"] = t["score"] / t["samples"]
      out[f"reward/{route}/failure_rate"] = t["failures"] / t["samples"]
      if t["checked"]:
        out[f"reward/{route}/true_accuracy"] = t["true_correct"] / t["checked"]
    self._totals.clear()
    for scorer in {id(s): s for s in self.routes.values()}.values():
      out.update(scorer.pop_metrics())
    if self.monitor is not None:
      self.monitor.pop_metrics()  # its per-task counters would repeat the true accuracy
    return out

  def close(self) -> None:
    """Closes the routes' and the monitor's scorers."""
    for scorer in {id(s): s for s in [*self.routes.values(), self.monitor] if s}.values():
      scorer.close()
