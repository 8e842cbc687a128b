"""The reward router: per-task dispatch, killable verifier workers, per-task metrics."""

import subprocess
import sys
import textwrap
import time

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import Scores
from rlhf_jax.rewards.router import VerifierScorer
from rlhf_jax.rewards.router import receive_verifiers
from rlhf_jax.sandbox.workers import KillablePool
from rlhf_jax.tasks import arith
from tests.fakes import FakeScorer
from tests.rewards import verifiers


@pytest.fixture(scope="module")
def router():
  router = RewardRouter(
      {"arith": arith.verify, "exact": verifiers.exact, "hangs": verifiers.hangs,
       "raises": verifiers.raises, "dies": verifiers.kills_its_worker,
       "junk": verifiers.returns_junk, "scaled": verifiers.scaled},
      scorers={"broken_model": FakeScorer(raises=RuntimeError("model scorer broke")),
               "length": FakeScorer(lambda example, response: float(len(response)))},
      correct_score=1.0, wrong_score=-1.0, failure_score=-0.5, timeout_s=1.0, max_workers=2)
  yield router
  router.close()


def test_every_failure_costs_only_its_sample_and_is_recorded(router):
  tasks = ["arith", "arith", "hangs", "raises", "dies", "junk", "broken_model", "exact",
           "length", "scaled"]
  examples = [Example("q", "4", task) for task in tasks]
  responses = ["Answer: 4", "Answer: 5", "x", "x", "x", "x", "x", "4", "abc", "four"]
  start = time.monotonic()
  scored = router.score(examples, responses)
  # One timeout, not the hung verifier's 60 s: the bound leaves room for the workers'
  # start-ups (each imports the verifiers' modules, jax among them: several seconds apiece
  # on a loaded machine, and a killed worker's replacement starts again).
  assert time.monotonic() - start < 45.0
  assert scored.scores == [1.0, -1.0, -0.5, -0.5, -0.5, -0.5, -0.5, 1.0, 3.0, 4.0]
  assert scored.correct == [True, False, False, False, False, False, False, True, True, True]
  failures = scored.failures
  assert failures[:2] == ["", ""] and failures[7:] == ["", "", ""]
  assert failures[2] == "timeout"
  assert failures[3].startswith("error: KeyError")
  assert failures[4].startswith("error: worker died")
  assert "not a Judgement" in failures[5]
  assert failures[6].startswith("scorer error: RuntimeError: model scorer broke")
  assert scored.reason(1) == "wrong answer" and scored.reason(0) == ""
  # The pool replaced the killed workers: the next call works.
  again = router.score([Example("q", "4", "exact")] * 3, ["4", "5", "4"])
  assert again.correct == [True, False, True] and again.reason(1) == "different"


def test_per_task_metrics_count_since_the_last_pop(router):
  router.pop_metrics()
  router.score([Example("q", "4", "exact")] * 4 + [Example("q", "4", "raises")],
               ["4", "4", "4", "5", "x"])
  metrics = router.pop_metrics()
  assert metrics["reward/exact/accuracy"] == 0.75
  assert metrics["reward/exact/failure_rate"] == 0.0
  assert metrics["reward/exact/samples"] == 4.0
  assert metrics["reward/raises/failure_rate"] == 1.0
  assert metrics["time_reward/exact"] >= 0.0
  assert router.pop_metrics() == {}


def test_unknown_tasks_and_bad_inputs_are_errors(router):
  with pytest.raises(ValueError, match="no scorer for task"):
    router.score([Example("a", "b", "unknown")], ["a"])
  with pytest.raises(ValueError, match="1 examples for 2 responses"):
    router.score([Example("a", "b", "arith")], ["a", "b"])
  assert isinstance(router, Scorer)


def test_a_scorer_that_is_not_a_scorer_is_refused_before_any_worker_starts():
  """Closing the router closes every scorer: one without `close` (or another method of
  the protocol) is named when the router is built, not probed for at the end."""

  class ScoreOnly:
    def score(self, examples, responses):
      return Scores([0.0] * len(responses), [False] * len(responses), [""] * len(responses))

  with pytest.raises(TypeError, match=r"scorers\['judged'\]: a ScoreOnly is not a Scorer"):
    RewardRouter({"exact": verifiers.exact}, scorers={"judged": ScoreOnly()})


def test_verifiers_must_be_module_level_functions():
  with pytest.raises(ValueError, match="verifier 'lambda_task' must be a module-level"):
    VerifierScorer({"lambda_task": lambda response, answer: True})


def test_pool_keeps_input_order_and_respects_its_size():
  # The workers import the verifiers' module as they start (as VerifierScorer's do): on a
  # busy machine that import alone may take longer than a call's limit.
  pool = KillablePool(2, timeout_s=5.0,
                      initializer=(receive_verifiers, ((verifiers.scaled,),)))
  try:
    results = pool.map([(verifiers.scaled, (str(i) * (i + 1), "")) for i in range(7)])
    assert results == [("ok", float(i + 1)) for i in range(7)]
    assert len(pool._workers) == 2  # pylint: disable=protected-access
  finally:
    pool.close()
  with pytest.raises(ValueError, match="size >= 1"):
    KillablePool(0, 1.0)


def test_router_for_tasks_mixes_math_code_and_arith_in_one_batch():
  from rlhf_jax.rewards.router import router_for_tasks
  router = router_for_tasks(["math", "pycalc", "arith"], correct_score=1.0, wrong_score=-1.0,
                            math_extractor="boxed", sandbox_timeout_s=5.0)
  try:
    examples = [Example("q", "\\frac{1}{2}", "math"), Example("q", "\\frac{1}{2}", "math"),
                Example("q", "assert x == 12", "pycalc"), Example("q", "12", "arith"),
                Example("q", "assert x == 12", "pycalc")]
    responses = ["so \\boxed{0.5}", "Answer: 0.5", "x=3*4", "Answer: 12", "x=3+4"]
    scored = router.score(examples, responses)
    assert scored.correct == [True, False, True, True, False]
    assert scored.scores == [1.0, -1.0, 1.0, 1.0, -1.0]
    assert scored.reason(1) == "no answer found"  # the boxed extractor was configured
    assert scored.reason(4).startswith("test failed: AssertionError")
    metrics = router.pop_metrics()
    assert metrics["reward/math/accuracy"] == 0.5 and metrics["reward/pycalc/samples"] == 2.0
  finally:
    router.close()
  with pytest.raises(ValueError, match="extractor"):
    router_for_tasks(["math"], math_extractor="bogus")


def _run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
  script = tmp_path / "script.py"
  script.write_text(textwrap.dedent(text))
  return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=240, cwd=tmp_path, check=False)


def test_a_call_deadline_does_not_include_the_workers_start_up(tmp_path):
  """spawn re-imports the main module in each worker: a slow import is start-up, not
  the call's time."""
  done = _run_script(tmp_path, """
      import operator
      import time
      time.sleep(2.0)  # a slow main-module import, repeated in every spawned worker
      from rlhf_jax.sandbox.workers import KillablePool
      if __name__ == "__main__":
        pool = KillablePool(1, timeout_s=1.0)
        print(pool.map([(operator.add, (1, 2))]))
        pool.close()
      """)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "[('ok', 3)]"


def test_a_verifier_slow_to_import_is_imported_at_start_up_not_in_a_samples_time():
  from tests.rewards import slow_import_verifier  # pylint: disable=import-outside-toplevel
  scorer = VerifierScorer({"slow": slow_import_verifier.always_right}, timeout_s=1.0,
                          max_workers=1)
  try:
    scored = scorer.score([Example("q", "4", "slow")] * 2, ["a", "b"])
  finally:
    scorer.close()
  assert scored.failures == ["", ""] and scored.correct == [True, True]


def test_a_tasks_failures_are_said_on_the_console_with_the_first_reason(router, caplog):
  router.pop_metrics()
  router.score([Example("q", "4", "raises")] * 2 + [Example("q", "4", "exact")], ["x", "y", "4"])
  with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
    metrics = router.pop_metrics()
  assert metrics["reward/raises/failure_rate"] == 1.0
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 1 and lines[0].startswith(
      "the scorer of task raises failed on 2 of 2 samples: error: KeyError"), lines


def test_a_script_without_a_main_guard_gets_an_error_not_a_hang(tmp_path):
  done = _run_script(tmp_path, """
      import operator
      from rlhf_jax.sandbox.workers import KillablePool
      pool = KillablePool(1, timeout_s=1.0)
      print(pool.map([(operator.add, (1, 2))]))
      """)
  assert done.returncode != 0
  assert "WorkerStartError" in done.stderr and '__name__ == "__main__"' in done.stderr
