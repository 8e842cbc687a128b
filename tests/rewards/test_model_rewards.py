"""Model-based rewards with tiny models built here: the BT reward model (training and
scoring), GenRM's verdict probability against a full forward, the pairwise judge's
two-order average, the PRM's step scores and labels, critic initialisation from a PRM,
hybrid routing, and preference-pair files."""

import dataclasses

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import PreferencePair
from rlhf_jax.data import read_pairs
from rlhf_jax.data import write_pairs
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards import hybrid
from rlhf_jax.rewards import pairwise
from rlhf_jax.rewards import prm as prm_lib
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.judge import verdict_token_ids
from rlhf_jax.rewards.reward_model import RewardModelScorer
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import arith
from rlhf_jax.algorithms.learner import critic_from_checkpoint
from rlhf_jax.rewards import model_training as rt
from rlhf_jax.optim.roles import FrozenRole
from tests.fakes import FakeScorer

TOKENIZER = arith.tokenizer()
CONFIG = arith.model_config(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1,
                            num_heads=2, max_positions=160)
LM, LM_PARAMS = models.init_model(CONFIG, seed=3)
LAYOUT = ScoringLayout(TOKENIZER, prefix=(), prompt_length=24, response_length=16)


@pytest.fixture(scope="module")
def judge_sampler():
  config = sampler_config_lib.sampler_config(num_slots=8, cache_length=136,
                                             prompt_buckets=(128,))
  config.warmup = False
  return sampler_config_lib.build_scheduler(config, LM, LM_PARAMS, tokenizer=TOKENIZER)


# One compiled forward for every question: rows right-padded to the model's positions (a
# causal model's logits at a position never see the padding after it).
_FORWARD = jax.jit(lambda ids: LM.apply(LM_PARAMS, ids)[0])


def full_forward_probabilities(questions, verdicts):
  """Softmax of the LM's next-token logits after each question, by a plain forward."""
  encoded = [TOKENIZER.encode(question) for question in questions]
  ids = np.zeros((len(encoded), CONFIG.max_position_embeddings), np.int32)
  for row, tokens in enumerate(encoded):
    ids[row, :len(tokens)] = tokens
  all_logits = np.asarray(_FORWARD(ids), np.float64)
  out = []
  for logits, tokens in zip(all_logits, encoded):
    logits = logits[len(tokens) - 1]
    p = np.exp(logits - logits.max())
    out.append((p / p.sum())[[TOKENIZER.encode(v)[0] for v in verdicts]])
  return np.asarray(out)


# ------------------------------------------------------------------ Bradley–Terry RM


def synthetic_pairs(seed, count):
  """Chosen: states the answer; rejected: a shorter line without it."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    a, b = rng.integers(10, 99, 2)
    pairs.append(PreferencePair(f"{a}+{b}?\n", f"Answer: {a + b}", rng.choice(["Hmm", "No"])))
  return pairs


def test_bradley_terry_training_raises_held_out_pair_accuracy():
  model, params = models.critic_from_policy(LM, LM_PARAMS)
  result = rt.train_bradley_terry(model, params, LAYOUT, synthetic_pairs(0, 64),
                                  synthetic_pairs(1, 32), steps=30, batch_size=16,
                                  learning_rate=3e-3)
  assert result.before == 0.0  # a zero head ties every pair
  assert result.after >= 0.9
  assert result.losses[-1] < result.losses[0]


@pytest.mark.slow
def test_reward_model_scorer_reads_the_last_token_and_records_too_long_responses():
  model, params = models.critic_from_policy(LM, LM_PARAMS)
  params = dict(params, scalar_head=jax.random.normal(jax.random.key(0), (32,)))
  scorer = RewardModelScorer(FrozenRole(model, params), LAYOUT, batch_size=4,
                             failure_score=-5.0)
  examples = [Example("1+2?\n", "3", "arith")] * 6
  responses = ["Answer: 3", "Answer: 4", "x" * 40, "", "Answer: 3", "12"]
  scored = scorer.score(examples, responses)
  assert scored.failures[2].startswith("too long") and scored.scores[2] == -5.0
  for i in (0, 1, 3, 4, 5):  # each row alone, by a plain forward
    ids = TOKENIZER.encode(examples[i].prompt) + TOKENIZER.encode(responses[i]) + [
        TOKENIZER.eos_id]
    values, _ = model.apply(params, np.asarray([ids], np.int32))
    assert scored.scores[i] == pytest.approx(float(values[0, -1]), abs=1e-4)
    assert scored.correct[i] == (scored.scores[i] > 0)
  assert scored.scores[0] == scored.scores[4]


# ------------------------------------------------------------------ generative judges


@pytest.mark.slow
def test_genrm_score_is_the_verdict_probability_of_a_full_forward(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "N"})
  judge = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=128,
                       min_verdict_mass=0.0)
  scorer = genrm.GenRMScorer(judge, mode="gt")
  examples = [Example("Ann has 3 pens.\n", "5", "arith"), Example("Bo?\n", "12", "x")]
  responses = ["Answer: 5", "1\n2\nAnswer: 7"]
  scored = scorer.score(examples, responses)
  questions = [genrm.judge_question(genrm.GT_TEMPLATE, e, r) for e, r in zip(examples,
                                                                          responses)]
  expected = full_forward_probabilities(questions, ("Y", "N"))[:, 0]
  np.testing.assert_allclose(scored.scores, expected, rtol=1e-4)
  assert scored.failures == ["", ""]


def test_genrm_failures_are_recorded_not_raised(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "N"})
  picky = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=80,
                       min_verdict_mass=0.99)  # a random model is never that sure
  examples = [Example("1+1?\n", "2", "arith"), Example("1+1?\n", "", "arith"),
              Example("long " * 30, "2", "arith")]
  scored = genrm.GenRMScorer(picky, mode="gt", failure_score=-1.0).score(
      examples, ["Answer: 2"] * 3)
  assert scored.scores == [-1.0] * 3
  assert "judge gave no verdict" in scored.failures[0]
  assert scored.failures[1] == "no ground-truth answer"
  assert "exceeds 80" in scored.failures[2]
  reference = genrm.GenRMScorer(picky, mode="reference").score([examples[0]], ["Answer: 2"])
  assert "no reference response" in reference.failures[0]


def test_pairwise_reward_averages_both_orders(judge_sampler):
  ids = verdict_token_ids(TOKENIZER, {"reward.pairwise.first": "A",
                                     "reward.pairwise.second": "B"})
  judge = VerdictJudge(judge_sampler, TOKENIZER, ids, max_prompt_tokens=128,
                       min_verdict_mass=0.0)
  scorer = pairwise.PairwiseScorer(judge, anchor_key="solution", centre=0.5)
  example = Example("1+2?\n", "3", "arith", metadata={"solution": "Answer: 3"})
  responses = ["Answer: 3", "Answer: 9"]
  scored = scorer.score([example] * 2, responses)
  for response, score in zip(responses, scored.scores):
    forward = full_forward_probabilities(
        [pairwise.pair_question(pairwise.PAIR_TEMPLATE, example.prompt, response, "Answer: 3"),
         pairwise.pair_question(pairwise.PAIR_TEMPLATE, example.prompt, "Answer: 3", response)],
        ("A", "B"))
    first_wins = forward[:, 0] / forward.sum(axis=1)
    assert score == pytest.approx(0.5 * (first_wins[0] + 1 - first_wins[1]) - 0.5, abs=1e-4)
  no_anchor = scorer.score([Example("1+2?\n", "3", "arith")], ["Answer: 3"])
  assert "no anchor" in no_anchor.failures[0]


def test_templates_name_their_placeholders():
  from rlhf_jax.rewards.judge import check_template
  check_template(genrm.GT_TEMPLATE, genrm.TEMPLATE_FIELDS["gt"], ("answer", "response"), "t")
  for bad, match in (("{prompt}{response}", "missing: \\['answer'\\]"),
                     ("{prompt}{answer}{response}{}", "unknown: \\[''\\]"),
                     ("{answer}{response}{extra}", "unknown: \\['extra'\\]")):
    with pytest.raises(ValueError, match=match):
      check_template(bad, genrm.TEMPLATE_FIELDS["gt"], ("answer", "response"), "t")


def test_verdicts_must_be_single_distinct_tokens():
  with pytest.raises(ConfigError, match=r"^config\.reward\.genrm\.yes: invalid value 'Yes': "
                     r"is \d+ tokens .*exactly one token") as error:
    verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Yes", "reward.genrm.no": "N"})
  assert error.value.field == "reward.genrm.yes"
  with pytest.raises(ConfigError, match=r"^config\.reward\.genrm\.no: invalid value 'Y': "
                     r"shares its token with reward\.genrm\.yes") as error:
    verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "Y"})
  assert error.value.field == "reward.genrm.no"


# ------------------------------------------------------------------ PRM


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
  values, _ = role.model.apply(role.params, np.asarray([ids], np.int32))
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
  values = np.asarray(response_values(critic, critic_params, batch))[0]
  ends = prm_lib.step_end_positions(TOKENIZER.encode(response), newline, TOKENIZER.eos_id)
  # The critic's value before token t+1 is the PRM's score after token t.
  np.testing.assert_allclose(values[[e + 1 for e in ends]], steps[0], atol=1e-5)


def test_step_targets_put_labels_at_step_ends():
  newline = prm_lib.step_end_token_ids(TOKENIZER)
  tokens, mask, targets, where = rt.step_targets(LAYOUT, ["1?\n"], ["a\nb\nc"],
                                                 [[1.0, 0.0, 0.0]], newline)
  assert np.flatnonzero(where[0]).tolist() == [1, 3, 4]
  assert targets[0, [1, 3, 4]].tolist() == [1.0, 0.0, 0.0]
  with pytest.raises(ValueError, match="2 step labels for 3 step ends"):
    rt.step_targets(LAYOUT, ["1?\n"], ["a\nb\nc"], [[1.0, 0.0]], newline)


# ------------------------------------------------------------------ routing


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


# ------------------------------------------------------------------ data


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_preference_pairs_round_trip(tmp_path, suffix):
  pairs = [PreferencePair("p", "good", "bad", {"level": 2}), PreferencePair("q", "a", "b")]
  path = str(tmp_path / f"pairs{suffix}")
  assert write_pairs(path, pairs) == 2
  assert read_pairs(path) == pairs


def test_a_bad_pair_names_the_line_and_field(tmp_path):
  path = tmp_path / "pairs.jsonl"
  path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n'
                  '{"prompt": "p", "chosen": 3, "rejected": "b"}\n')
  with pytest.raises(ValueError, match=r"pairs.jsonl:2: field 'chosen'"):
    read_pairs(str(path))


def test_arith_pairs_always_reject_a_wrong_answer():
  from rlhf_jax.tasks import arith_rewards
  for pair in arith_rewards.preference_pairs(0, 30):
    answer = pair.metadata["answer"]
    assert arith.verify(pair.chosen, answer) and not arith.verify(pair.rejected, answer)
  judged = arith_rewards.judged_responses(0, 60)
  assert all(arith.verify(r, e.answer) == ok for e, r, ok in judged)
  assert 0 < sum(ok for *_, ok in judged) < 60
  with_references = arith_rewards.judged_with_references(0, 60)
  assert [(e.prompt, r, ok) for e, r, ok in with_references] == [
      (e.prompt, r, ok) for e, r, ok in judged]
  references = [e.metadata["reference"] for e, _, _ in with_references]
  assert 0 < sum(arith.verify(ref, e.answer) for ref, (e, _, _) in
                 zip(references, with_references)) < 60
  questions = rt.genrm_sft_pairs(with_references, template=genrm.REFERENCE_TEMPLATE, yes="Y",
                                 no="N")
  assert all(ref in q for ref, (q, _) in zip(references, questions))

