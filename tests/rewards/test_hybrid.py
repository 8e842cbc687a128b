"""Routing each sample to a reward (rewards/hybrid.py): routes in order, per-route metrics, a
monitor, a failing scorer, and a sample no route takes."""

from __future__ import annotations

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import hybrid
from tests.fakes import FakeScorer


def constant(value, *, correct=True, raises=False):
  """A scorer giving one score (or raising) and counting its samples (`seen`)."""
  return FakeScorer(lambda example, response: value, correct_if=lambda score: correct,
                    raises=RuntimeError("boom") if raises else None)


def test_hybrid_routes_in_order_and_reports_per_route_metrics():
  routes = {"verifier": constant(1.0), "genrm_gt": constant(0.7),
            "genrm_reference": constant(0.4), "rm": constant(-0.2, correct=False)}
  choose = hybrid.hybrid_chooser(routes, ["arith"])
  monitor = constant(0.0, correct=False)
  scorer = hybrid.RoutedScorer(routes, choose, monitor=monitor, monitor_tasks=["arith"])
  examples = [Example("q", "1", "arith"), Example("q", "1", "chat"),
              Example("q", "", "chat", metadata={"reference": "r"}), Example("q", "", "chat"),
              Example("q", "1", "arith"), Example("q", "", "chat", metadata={"reference": ""})]
  scored = scorer.score(examples, ["r"] * 6)
  assert scored.scores == [1.0, 0.7, 0.4, -0.2, 1.0, -0.2]  # an empty reference falls through
  metrics = scorer.pop_metrics()
  assert metrics["reward/verifier/share"] == pytest.approx(2 / 6)
  assert metrics["reward/rm/score_mean"] == pytest.approx(-0.2)
  assert "reward/genrm_gt/true_accuracy" not in metrics  # no monitored task routed there
  assert monitor.seen == 0 and scorer.pop_metrics() == {}


def test_a_single_route_with_a_monitor_and_a_failing_scorer():
  monitor = constant(0.0, correct=True)
  scorer = hybrid.RoutedScorer({"rm": constant(2.0)}, lambda e: "rm", monitor=monitor,
                               monitor_tasks=["arith"])
  scorer.score([Example("q", "1", "arith"), Example("q", "1", "chat")], ["a", "b"])
  metrics = scorer.pop_metrics()
  assert metrics["reward/rm/true_accuracy"] == 1.0 and monitor.seen == 1
  failing = hybrid.RoutedScorer({"rm": constant(0, raises=True)}, lambda e: "rm",
                                failure_score=-3.0)
  scored = failing.score([Example("q", "1", "arith")], ["a"])
  assert scored.scores == [-3.0] and "boom" in scored.failures[0]
  none = hybrid.RoutedScorer({"rm": constant(0)}, lambda e: "").score(
      [Example("q", "1", "x")], ["a"])
  assert "no reward route" in none.failures[0]
  with pytest.raises(ValueError, match="unknown reward route"):
    hybrid.RoutedScorer({"magic": constant(0)}, lambda e: "magic")
