"""The evaluation's statistics against references written here from their definitions:
pass@k by enumerating every k-subset of the samples, maj@n by hand, the bootstrap by a
plain loop of NumPy resamples with the same seed."""

import itertools

import numpy as np
import pytest

from rlhf_jax.rollout import eval_stats


def brute_force_pass_at_k(verdicts, k):
  """The share of k-subsets of the samples that hold a correct one (pass@k's definition:
  the chance that k samples drawn without replacement include a correct one)."""
  subsets = list(itertools.combinations(range(len(verdicts)), k))
  return sum(any(verdicts[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("verdicts", [
    [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 0], [1, 1, 1],
    [0, 0, 0, 0, 0, 1],
])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(verdicts):
  n = len(verdicts)
  correct = np.asarray([verdicts], bool)
  for k in range(1, n + 1):
    expected = brute_force_pass_at_k(verdicts, k)
    assert eval_stats.pass_at_k(n, sum(verdicts), k) == pytest.approx(expected)
    assert eval_stats.per_problem_pass_at_k(correct, k) == pytest.approx([expected])


def test_pass_at_k_reports_every_power_of_two_and_n():
  assert eval_stats.ks_up_to(1) == [1]
  assert eval_stats.ks_up_to(8) == [1, 2, 4, 8]
  assert eval_stats.ks_up_to(6) == [1, 2, 4, 6]
  with pytest.raises(ValueError, match="k=3 exceeds"):
    eval_stats.pass_at_k(2, 1, 3)


def test_majority_vote_by_hand():
  vote = eval_stats.majority_vote
  # 7 twice, 8 once: 7 wins, and its verdict is that of its first sample.
  assert vote(["7", "8", "7"], [True, False, True]) == ("7", True)
  assert vote(["8", "7", "8"], [False, True, False]) == ("8", False)
  # Whitespace is not a different answer; a sample without an answer does not vote.
  assert vote([None, " 7", "7 ", None, "8"], [False, True, True, False, False]) == ("7", True)
  # A tie goes to the answer whose first sample comes first.
  assert vote(["8", "7", "7", "8"], [False, True, True, False]) == ("8", False)
  assert vote(["7", "8", "8", "7"], [True, False, False, True]) == ("7", True)
  # No answer at all: no majority, not correct.
  assert vote([None, None], [False, False]) == (None, False)
  # "1/2" and "0.5" are two votes (exact match), though both are correct.
  assert vote(["1/2", "0.5", "0.5", "3"], [True, True, True, False]) == ("0.5", True)
  answers = [["7", "8", "7"], ["1", "2", "2"], [None, None, None]]
  correct = np.asarray([[1, 0, 1], [1, 0, 0], [0, 0, 0]], bool)
  assert eval_stats.per_problem_maj(answers, correct).tolist() == [1.0, 0.0, 0.0]


def reference_interval(values, resamples, seed, level=0.95):
  """A percentile bootstrap written out: `resamples` draws of P problems with
  replacement, one by one, and the quantiles of their means."""
  rng = np.random.default_rng(seed)
  means = []
  for _ in range(resamples):
    rows = rng.integers(0, len(values), size=len(values))
    means.append(np.mean([values[i] for i in rows]))
  return tuple(np.percentile(means, [50 * (1 - level), 50 * (1 + level)]))


def test_bootstrap_interval_matches_a_plain_resampling_loop():
  values = np.random.default_rng(3).random(37)
  for seed, resamples in ((0, 1000), (5, 200)):
    got = eval_stats.bootstrap_interval(values, resamples=resamples, seed=seed)
    assert got == pytest.approx(reference_interval(values, resamples, seed))
  got = eval_stats.bootstrap_interval(values, resamples=300, seed=1, level=0.9)
  assert got == pytest.approx(reference_interval(values, 300, 1, level=0.9))
  with pytest.raises(ValueError, match="one value per problem"):
    eval_stats.bootstrap_interval([])


def test_bootstrap_interval_holds_the_estimate_and_narrows_with_more_problems():
  rng = np.random.default_rng(0)
  widths = []
  for problems in (20, 200, 2000):
    values = (rng.random(problems) < 0.4).astype(float)
    low, high = eval_stats.bootstrap_interval(values)
    assert low <= values.mean() <= high
    widths.append(high - low)
  assert widths[0] > widths[1] > widths[2] > 0
  # Roughly the normal interval of a proportion: 2 * 1.96 * sqrt(p (1 - p) / P).
  assert widths[2] == pytest.approx(2 * 1.96 * np.sqrt(0.4 * 0.6 / 2000), rel=0.2)


def table(correct, answers=None, levels=None):
  correct = np.asarray(correct, bool)
  problems, n = correct.shape
  return eval_stats.SampleTable(
      correct=correct, answers=answers or [[None] * n for _ in range(problems)],
      lengths=np.full(correct.shape, 5.0), truncated=np.zeros(correct.shape, bool),
      no_answer=np.zeros(correct.shape, bool), failures=np.zeros(correct.shape, bool),
      groups={"level": levels} if levels else {})


def test_report_figures_and_intervals_from_their_definitions():
  correct = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
  answers = [["4", "5", "5", "4"], ["1", "1", "2", None], ["3", "3", "3", "3"]]
  greedy = table([[1], [0], [0]])
  out = eval_stats.report(table(correct, answers, ["1", "2", "2"]), greedy=greedy,
                          resamples=500, seed=2)
  assert out["avg@4"] == out["accuracy"] == pytest.approx(6 / 12)
  assert out["pass@1"] == pytest.approx(6 / 12)
  assert out["pass@2"] == pytest.approx((brute_force_pass_at_k([1, 0, 0, 1], 2) + 0 + 1) / 3)
  # maj@4: problem 0 ties 4/5 two each, 4 first and correct; problem 1: "1"; problem 2: "3".
  assert out["maj@4"] == pytest.approx(2 / 3)
  assert out["greedy_accuracy"] == pytest.approx(1 / 3)
  per_problem = {"avg@4": [0.5, 0, 1], "maj@4": [1, 0, 1], "greedy_accuracy": [1, 0, 0]}
  for name, values in per_problem.items():
    interval = out["interval"][name]
    assert interval["value"] == pytest.approx(np.mean(values))
    assert (interval["low"], interval["high"]) == pytest.approx(
        reference_interval(values, 500, 2))
  by_level = out["breakdown"]["level"]
  assert sorted(by_level) == ["1", "2"]
  assert by_level["2"]["avg@4"] == pytest.approx(0.5) and by_level["1"]["maj@4"] == 1.0
  assert "maj@4" not in eval_stats.report(table(correct))  # no answers read: no vote


def test_paired_difference_resamples_the_same_problems():
  first = table([[1, 0], [0, 0], [1, 1], [0, 1]])
  second = table([[1, 1], [0, 1], [1, 1], [0, 0]])
  out = eval_stats.paired_difference(first, second, resamples=400, seed=4)
  differences = [0.5, 0.5, 0.0, -0.5]
  assert out["avg@2"]["value"] == pytest.approx(np.mean(differences))
  assert (out["avg@2"]["low"], out["avg@2"]["high"]) == pytest.approx(
      reference_interval(differences, 400, 4))
  with pytest.raises(ValueError, match="the same problems"):
    eval_stats.paired_difference(first, table([[1, 0]]))


def test_markdown_table_gives_value_and_interval_in_percent():
  out = eval_stats.report(table([[1, 0], [1, 1]]), greedy=table([[1], [0]]), resamples=100)
  lines = eval_stats.markdown_table({"policy": out}).splitlines()
  header = [c.strip() for c in lines[0].split("|")[1:-1]]
  assert header == ["95 % intervals", "greedy_accuracy", "avg@2", "pass@1", "pass@2"]
  cells = [c.strip() for c in lines[2].split("|")[1:-1]]
  low, high = out["interval"]["avg@2"]["low"], out["interval"]["avg@2"]["high"]
  assert cells[0] == "policy" and cells[2] == f"75.0 [{100 * low:.1f}, {100 * high:.1f}]"


def test_a_table_that_cannot_tell_no_answers_reports_no_rate():
  episodes = table([[1, 0], [0, 0]])
  episodes.no_answer = None  # whole episodes: the final answer is not read
  figures = eval_stats.point_figures(episodes)
  assert "no_answer_rate" not in figures and figures["avg@2"] == 0.25
  out = eval_stats.report(episodes, greedy=episodes, resamples=50)
  assert "greedy_no_answer_rate" not in out and out["greedy_accuracy"] == 0.25
  assert eval_stats.point_figures(table([[1, 0]]))["no_answer_rate"] == 0.0
