"""The one place that reads `reward.*` (rewards/build.py), with rule verifiers and reward
functions only (no model loads): which scorer each route builds, the evaluation's scorer
(the verifiers' true accuracy), whether a run needs models, and the PRM's step ends."""

from __future__ import annotations

import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rewards.function_scorer import FunctionScorer
from rlhf_jax.rewards.router import RewardRouter
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

FNS = "tests.rewards.reward_fns"


def test_what_a_run_needs_of_the_reward():
  c = base_config("arith")
  assert not reward_build.scores_any_task(c) and not reward_build.uses_models(c)
  c.reward.function = f"{FNS}:async_length"
  assert reward_build.scores_any_task(c) and not reward_build.uses_models(c)
  c.reward.function, c.reward.route = "", "rm"
  assert reward_build.scores_any_task(c) and reward_build.uses_models(c)
  c.reward.route, c.reward.process.checkpoint = "verifier", "/some/prm"
  assert reward_build.uses_models(c) and not reward_build.scores_any_task(c)


def test_the_verifier_route_and_the_evaluations_scorer():
  c = base_config("arith")
  tokenizer = models.build_character_tokenizer("0123456789abc \n:Aswer")
  verifier = reward_build.training_scorer(c, ["arith"], None, PromptFormat(tokenizer))
  try:  # the rule verifiers' router (scoring through its workers: the hybrid test below)
    assert isinstance(verifier, RewardRouter)
    verifier.check_tasks(["arith"])
    with pytest.raises(ValueError, match="poetry"):
      verifier.check_tasks(["poetry"])
    assert reward_build.evaluation_scorer(c, verifier, ["arith"]) is verifier
  finally:
    verifier.close()
  c.reward.function = f"{FNS}:async_length"
  function = reward_build.training_scorer(c, ["arith"], None, PromptFormat(tokenizer))
  evaluation = reward_build.evaluation_scorer(c, function, ["arith"])
  try:
    assert isinstance(function, FunctionScorer) and evaluation is not function
    assert not isinstance(evaluation, FunctionScorer)  # the verifiers' router
    # A task without a verifier: the training reward is the evaluation's too.
    assert reward_build.evaluation_scorer(c, function, ["arith", "free"]) is function
  finally:
    function.close()
    evaluation.close()
  with pytest.raises(ValueError, match="reward.function needs the run's PromptFormat"):
    reward_build.training_scorer(c, ["arith"], None)


def test_step_ends_and_a_delimiter_no_token_holds():
  tokenizer = models.build_character_tokenizer("abc \n")
  c = base_config("arith")
  assert reward_build.step_end_ids(c, tokenizer) is None  # no PRM
  c.reward.process.checkpoint = "/some/prm"
  assert reward_build.step_end_ids(c, tokenizer) == frozenset(tokenizer.encode("\n"))
  c.reward.process.step_delimiter = "\n\n"
  with pytest.raises(ConfigError, match=r"^config\.reward\.process\.step_delimiter: invalid "
                                        r"value '\\n\\n': no token of the tokenizer contains"):
    reward_build.step_ends_of(c, tokenizer)


def test_hybrid_route_gives_the_function_the_tasks_without_a_verifier():
  c = base_config("arith")
  c.reward.route, c.reward.function = "hybrid", f"{FNS}:async_length"
  validate_config(c)
  tokenizer = models.build_character_tokenizer("0123456789abc \n:Aswer")
  scorer = reward_build.training_scorer(c, ["arith", "free"], None, PromptFormat(tokenizer))
  try:
    out = scorer.score([Example("1+1", "2", "arith"), Example("q", "", "free")],
                       ["Answer: 2", "abc"])
    assert out.scores == [1.0, 3.0]  # arith's verifier (DAPO ±1 preset: +1), the length
    metrics = scorer.pop_metrics()
    assert metrics["reward/verifier/share"] == metrics["reward/function/share"] == 0.5
  finally:
    scorer.close()
