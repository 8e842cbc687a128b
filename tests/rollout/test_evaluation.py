"""The held-out evaluation's samples and figures: what the verifier read from each response
(maj@n's votes, "no answer found"), truncation, and the breakdown labels."""

import numpy as np
import pytest

from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rewards.router import router_for_tasks
from rlhf_jax.rollout.evaluation import evaluate_policy
from tests.fakes import ALPHABET
from tests.fakes import FakeSampler
from tests.fakes import fake_tokenizer

# Per prompt, sample i's response: problem "a" (answer 7) and problem "b" (answer 5).
RESPONSES = {"a": ["1+6\nAnswer: 7", "Answer: 8", "Answer: 7"],
             "b": ["no idea", "Answer: 5", "Answer: 6"]}


@pytest.fixture(scope="module")
def scorer():
  scorer = router_for_tasks(["arith", "math"], workers=1)
  yield scorer
  scorer.close()


def evaluate(scorer, task="arith", finish_reason="stop", samples=3, **kwargs):
  tokenizer = fake_tokenizer(ALPHABET + "A")
  examples = [Example("a", "7", task, {"level": 1, "data_source": "x"}),
              Example("b", "5", task, {"level": 2})]

  def respond(prompt, sampling, i):
    return tokenizer.encode(RESPONSES[tokenizer.decode(prompt)][i])

  sampler = FakeSampler(respond, finish_reason=finish_reason)
  return evaluate_policy(sampler, PromptFormat(tokenizer), examples, scorer, samples=samples,
                         temperature=1.0, max_new_tokens=16, details=True, **kwargs)


def test_figures_from_the_verdicts_and_the_answers_the_verifier_read(scorer):
  figures, table = evaluate(scorer)
  assert table.correct.tolist() == [[True, False, True], [False, True, False]]
  assert table.answers == [["7", "8", "7"], [None, "5", "6"]]
  assert table.no_answer.tolist() == [[False] * 3, [True, False, False]]
  assert figures["accuracy"] == figures["avg@3"] == pytest.approx(3 / 6)
  assert figures["no_answer_rate"] == pytest.approx(1 / 6)
  # a: "7" twice; b: "5" and "6" once each, "5" first: both majorities correct.
  assert figures["maj@3"] == 1.0
  assert figures["pass@1"] == pytest.approx(0.5) and figures["pass@3"] == 1.0
  assert figures["truncation_rate"] == 0.0
  lengths = [[len(r) for r in RESPONSES[p]] for p in "ab"]
  assert figures["response_length"] == pytest.approx(np.mean(lengths))
  assert figures["accuracy/L1"] == pytest.approx(2 / 3)  # train.py's per-level figure
  assert table.groups == {"task": ["arith", "arith"], "data_source": ["x", "–"],
                          "level": ["1", "2"]}


def test_truncated_responses_are_counted(scorer):
  figures, table = evaluate(scorer, finish_reason="length")
  assert figures["truncation_rate"] == 1.0 and table.truncated.all()


def test_math_reads_bare_answers_and_counts_no_answer(scorer):
  figures, table = evaluate(scorer, task="math")
  # math's verifier reads "Answer: 7" lines too, and "no idea" is no answer.
  assert table.answers == [["7", "8", "7"], [None, "5", "6"]]
  assert figures["no_answer_rate"] == pytest.approx(1 / 6)
