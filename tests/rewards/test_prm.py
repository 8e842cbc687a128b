"""The line-level process reward model (rewards/prm.py) on a tiny model built here: step ends
and steps agree, the binary search for the first unrecoverable step, step scores at step
ends added by the scorer, and a critic initialised from a PRM giving its step values."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.data import Example
from rlhf_jax.rewards import prm as prm_lib
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.algorithms.learner import critic_from_checkpoint
from rlhf_jax.optim.roles import FrozenRole
from tests.fakes import FakeScorer
from tests.rewards.tiny_lm import LAYOUT
from tests.rewards.tiny_lm import LM
from tests.rewards.tiny_lm import LM_PARAMS
from tests.rewards.tiny_lm import TOKENIZER


def test_step_ends_and_steps_agree():
  newline = prm_lib.step_end_token_ids(TOKENIZER)
  for text in ["1=2\n3=4\nAnswer: 5", "a\nb\n", "single", "\n\nx"]:
    ids = TOKENIZER.encode(text)
    ends = prm_lib.step_end_positions(ids + [TOKENIZER.eos_id], newline, TOKENIZER.eos_id)
    steps = prm_lib.token_steps(TOKENIZER, text, newline)
    assert "".join(steps) == text and len(ends) == len(steps)
    assert ends[-1] == len(ids) - 1
    assert [TOKENIZER.decode(ids[:e + 1]) for e in ends] == [
        "".join(steps[:k + 1]) for k in range(len(steps))]
  assert prm_lib.token_steps(TOKENIZER, "", newline) == []
  assert "".join(prm_lib.token_steps(TOKENIZER, "1=2\n3", newline)) == "1=2\n3"
  with pytest.raises(ValueError, match="no token of the tokenizer contains"):
    prm_lib.step_end_token_ids(TOKENIZER, "\n\n")


def test_a_token_with_two_delimiters_ends_one_step():
  from rlhf_jax import models as models_lib
  tokenizer = models_lib.train_bpe_tokenizer(["a\n\nb\n\nc\n"] * 50, vocab_size=300)
  newline = prm_lib.step_end_token_ids(tokenizer)
  text = "a\n\nb\nc"
  ids = tokenizer.encode(text)
  steps = prm_lib.token_steps(tokenizer, text, newline)
  assert "".join(steps) == text
  assert len(steps) == len(prm_lib.step_end_positions(ids, newline, tokenizer.eos_id))


def test_binary_search_finds_the_first_unrecoverable_step():
  rng = np.random.default_rng(0)
  for _ in range(50):
    counts = list(rng.integers(1, 12, 7))
    truth = [int(rng.integers(1, k + 1)) for k in counts]  # recoverable(k) iff k < truth
    calls = []

    def recoverable(queries):
      calls.append(len(queries))
      return [k < truth[i] for i, k in queries]

    assert prm_lib.first_unrecoverable_steps(counts, recoverable) == truth
    assert len(calls) <= int(np.ceil(np.log2(max(counts)))) + 1
  assert prm_lib.step_labels(4, False, 3) == [1.0, 1.0, 0.0, 0.0]
  assert prm_lib.step_labels(3, True, None) == [1.0, 1.0, 1.0]


def prm_role():
  model, params = models.critic_from_policy(LM, LM_PARAMS)
  params = dict(params, scalar_head=jax.random.normal(jax.random.key(1), (32,)),
                scalar_bias=np.float32(0.3))
  return FrozenRole(model, params)


def test_prm_step_scores_sit_at_step_ends_and_the_scorer_adds_them():
  role = prm_role()
  newline = prm_lib.step_end_token_ids(TOKENIZER)
  prm = prm_lib.ProcessRewardModel(role, LAYOUT, newline, batch_size=2)
  prompt, response = "2+2?\n", "1=4\nAnswer: 4"
  steps, failures = prm.step_scores([prompt, prompt], [response, "x" * 30])
  assert failures[0] == "" and failures[1].startswith("too long") and steps[1] == []
  ids = TOKENIZER.encode(prompt) + TOKENIZER.encode(response)
  values = jax.jit(lambda p, t: role.model.apply(p, t)[0])(role.params,
                                                          np.asarray([ids], np.int32))
  offset = len(TOKENIZER.encode(prompt))
  ends = prm_lib.step_end_positions(TOKENIZER.encode(response), newline, TOKENIZER.eos_id)
  np.testing.assert_allclose(steps[0], np.asarray(values[0])[[offset + e for e in ends]],
                             atol=1e-5)

  outcome = FakeScorer(lambda example, response: 1.0)  # every answer right
  scored = prm_lib.WithProcessRewards(outcome, prm).score(
      [Example(prompt, "4", "arith")], [response])
  assert scored.scores == [1.0] and scored.step_scores == [steps[0]]

  class Broken(ScorerBase):
    def step_scores(self, prompts, responses):
      raise RuntimeError("device lost")

  guarded = prm_lib.WithProcessRewards(outcome, Broken())
  scored = guarded.score([Example(prompt, "4", "arith")], [response])
  assert scored.scores == [1.0] and scored.step_scores == [[]]
  assert guarded.pop_metrics()["reward/prm/failures"] == 1.0


def test_critic_initialised_from_a_prm_gives_its_step_values(tmp_path):
  role = prm_role()
  models.save_policy(str(tmp_path / "prm"), role.model, role.params, TOKENIZER, [])
  critic, critic_params = critic_from_checkpoint(str(tmp_path / "prm"), LM)
  newline = prm_lib.step_end_token_ids(TOKENIZER)
  prm = prm_lib.ProcessRewardModel(role, LAYOUT, newline)
  prompt, response = "3+4?\n", "1=7\n2\nAnswer: 7"
  steps, _ = prm.step_scores([prompt], [response])
  from rlhf_jax.batch import encode_pairs, response_values
  batch = encode_pairs(TOKENIZER, [prompt], [response], prompt_prefix=(),
                       prompt_length=LAYOUT.prompt_length,
                       response_length=LAYOUT.response_length)
  values = np.asarray(jax.jit(lambda p, b: response_values(critic, p, b))(critic_params,
                                                                        batch))[0]
  ends = prm_lib.step_end_positions(TOKENIZER.encode(response), newline, TOKENIZER.eos_id)
  # The critic's value before token t+1 is the PRM's score after token t.
  np.testing.assert_allclose(values[[e + 1 for e in ends]], steps[0], atol=1e-5)
