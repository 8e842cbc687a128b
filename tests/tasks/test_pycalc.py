"""The pycalc task (tasks/pycalc.py): its examples are arith problems whose answer is a test,
scored by the code sandbox (its reference program right, others wrong)."""

from __future__ import annotations

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import code
from rlhf_jax.tasks import pycalc
from rlhf_jax.tasks import arith


def test_pycalc_examples_are_scored_by_the_sandbox():
  examples = pycalc.examples(seed=3, count=4, levels=(1, 2))
  problems = list(arith.generate(3, 4, (1, 2)))
  for example, problem in zip(examples, problems):
    assert example.task == "pycalc" and example.answer == f"assert x == {problem.answer}"
  scorer = code.CodeScorer(("pycalc",), correct_score=1.0, wrong_score=-1.0, timeout_s=5.0)
  responses = [pycalc.program(problems[0]), f"x={problems[1].answer + 1}",
               "import os\nos._exit(0)", "x=("]
  scored = scorer.score(examples, responses)
  assert scored.scores == [1.0, -1.0, -1.0, -1.0]
  assert scored.correct == [True, False, False, False]
  assert scored.failures == ["", "", "", ""]
  assert scored.reason(1).startswith("test failed") and scored.reason(3).startswith("syntax")
  with pytest.raises(ValueError, match="not \\['code'\\]"):
    scorer.check_tasks(["code"])
  assert Example  # the scorer takes data.Example rows
