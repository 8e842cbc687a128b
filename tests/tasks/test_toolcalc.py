"""The toolcalc task (tasks/toolcalc.py): its problems, its demonstrations laid out exactly
as a multi-turn rollout with the calculator lays out the same episode, and (slow) the
preset's warm start and a few RL steps."""

import numpy as np
import pytest

from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.envs import EnvironmentRunner
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.multi_turn import MultiTurnRollout
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import toolcalc
from rlhf_jax.training import loop
from rlhf_jax.training import stages
from rlhf_jax.training.config import validate_config
from tests.fakes import FakeSampler
from tests.fakes import FakeScorer
from tests.training.runs import preset
from tests.training.runs import records
from tests.training.runs import shrink

TOKENIZER = toolcalc.tokenizer()
PREFIX = [TOKENIZER.backend.token_to_id("<|im_start|>")]


def test_problems_have_the_levels_digits_and_the_product_as_answer():
  for level, (digits_a, digits_b) in toolcalc.LEVELS.items():
    for example in toolcalc.examples(level, 20, levels=(level,)):
      a, b = example.metadata["a"], example.metadata["b"]
      assert (len(str(a)), len(str(b))) == (digits_a, digits_b)
      assert example.answer == str(a * b) and example.task == "toolcalc"
      assert f"{a} boxes of {b}" in example.prompt
  with pytest.raises(ValueError, match="level=5"):
    next(toolcalc.generate(0, 1, levels=(5,)))


def test_a_demonstration_spells_the_call_the_tool_turn_and_the_answer():
  problem = arith.Problem(a=4721, b=386, op="*", level=2)
  ids, mask = toolcalc.demonstration(problem, TOKENIZER, direct=False)
  call = '<tool_call>{"name":"calculator","arguments":{"expression":"4721*386"}}</tool_call>'
  tool = "\n<|im_start|>tool\n1822306<|im_end|>\n<|im_start|>assistant\n"
  assert TOKENIZER.decode(ids, skip_special_tokens=False) == (
      call + "<|im_end|>" + tool + "Answer: 1822306<|endoftext|>")
  n_call = len(call) + 1  # one token per character, the turn end one token
  n_tool = len(TOKENIZER.encode(tool))
  assert mask == [1] * n_call + [0] * n_tool + [1] * (len(ids) - n_call - n_tool)
  direct, direct_mask = toolcalc.demonstration(problem, TOKENIZER, direct=True)
  assert TOKENIZER.decode(direct) == "Answer: 1822306" and direct_mask == [1] * len(direct)
  assert toolcalc.verify("Answer: 1822306", "1822306")


def teacher(rows):
  """A Sampler that plays the demonstrations (`rows`: prompt ids → demonstration ids):
  each request must be the prompt and a prefix of its demonstration; it answers with the
  demonstration's next model turn."""

  def next_turn(prompt, sampling, index):
    full = next(row_prompt + ids for row_prompt, ids in rows
                if prompt[:len(row_prompt)] == row_prompt)
    assert full[:len(prompt)] == prompt, "the rollout's row left the demonstration"
    turn = []
    for token in full[len(prompt):]:
      turn.append(token)
      if token in sampling.stop_token_ids:
        break
    return turn

  return FakeSampler(next_turn, sampled_logprob=0.0, model_logprob=-0.5)


class Stream:
  def __init__(self, examples):
    self.examples = examples

  def take(self, n):
    return self.examples[:n]


def arith_verifier():
  """Scores 1.0 for the right product, else 0.0."""
  return FakeScorer(lambda example, response: float(toolcalc.verify(response, example.answer)),
                    correct_if=lambda score: score > 0)


def teacher_rollout(examples, demos, factory="rlhf_jax.envs.tools:calculator_environment"):
  prompts = [PREFIX + TOKENIZER.encode(e.prompt) for e in examples]
  generator = GroupGenerator(teacher([(p, ids) for p, (ids, _) in zip(prompts, demos)]),
                             arith_verifier(), PromptFormat(TOKENIZER, PREFIX, prompt_length=64),
                             sampling=SamplingParams(max_new_tokens=96), seed=0)
  runner = EnvironmentRunner(factory, workers=1, timeout_s=10.0)
  return MultiTurnRollout(generator, Stream(examples), runner,
                          prompts_per_step=len(examples), group_size=1, max_turns=2,
                          max_tokens=160, failure_score=-3.0,
                          turn_end_id=TOKENIZER.backend.token_to_id(toolcalc.TURN_END))


def test_a_rollout_with_the_calculator_lays_out_the_demonstration_row():
  examples = toolcalc.examples(3, 4, levels=(2, 3, 4))
  problems = [arith.Problem(a=e.metadata["a"], b=e.metadata["b"], op="*", level=1)
              for e in examples]
  demos = [toolcalc.demonstration(p, TOKENIZER, direct=i % 2 == 1)
           for i, p in enumerate(problems)]
  mode = teacher_rollout(examples, demos)
  try:
    rollouts = mode.collect()
  finally:
    mode.close()
  batch = rollouts.batch
  for row, (ids, mask) in enumerate(demos):
    n = int(batch.lengths[row])
    assert np.asarray(batch.tokens[row])[64:64 + n].tolist() == ids
    assert np.asarray(batch.response_mask[row])[:n].tolist() == mask
  assert rollouts.correct == [True] * 4
  assert [len(t) for t in rollouts.transcripts] == [3, 1, 3, 1]


def test_an_observation_the_tokenizer_cannot_encode_fails_only_its_episode():
  examples = toolcalc.examples(4, 2, levels=(2,))
  problems = [arith.Problem(a=e.metadata["a"], b=e.metadata["b"], op="*", level=1)
              for e in examples]
  demos = [toolcalc.demonstration(p, TOKENIZER, direct=i == 1)
           for i, p in enumerate(problems)]
  mode = teacher_rollout(examples, demos, factory="tests.envs.environments:Accented")
  try:
    rollouts = mode.collect()
  finally:
    mode.close()
  assert rollouts.batch.scores.tolist() == [-3.0, 1.0]  # the direct answer never stepped
  assert len(rollouts.failures) == 1
  assert rollouts.failures[0].startswith("observation: the tokenizer cannot encode 'r")


@pytest.mark.parametrize("field, value", [("rollout.mode", "groups"), ("env.turn_end", ""),
                                          ("rollout.max_new_tokens", 60),
                                          ("env.max_tokens", 120)])
def test_the_task_refuses_runs_its_demonstrations_do_not_fit(field, value):
  config = preset("toolcalc")
  validate_config(config, num_devices=1)
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ConfigError, match=f"config.{field}"):
    validate_config(config, num_devices=1)


def test_an_arith_warm_start_is_not_taken_for_the_toolcalc_one(tmp_path):
  from rlhf_jax import models
  tokenizer = arith.tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
      max_positions=64), seed=0)
  models.save_policy(str(tmp_path / "sft"), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  config = preset("toolcalc")
  with pytest.raises(ConfigError, match="config.model.checkpoint"):
    stages.ensure_arith_warm_start(config, str(tmp_path), log=lambda line: None)


@pytest.mark.slow
def test_the_preset_warm_starts_on_demonstrations_and_takes_rl_steps(tmp_path):
  config = shrink(preset("toolcalc"))
  config.rollout.max_new_tokens, config.env.max_tokens = 96, 160
  config.sampler.cache_length = 64 + 160
  config.sampler.prompt_buckets = (64, 223)
  config.env.workers = 1
  stages.ensure_arith_warm_start(config, str(tmp_path), log=lambda line: None)
  summary = loop.Trainer(config, str(tmp_path), log=lambda line: None).run()
  assert summary["steps"] == 2
  logged = records(tmp_path)
  assert logged[0]["step"] == 0 and 1 <= logged[0]["eval_turns"] <= 2
  for record in logged[1:]:
    assert record["env/failed_fraction"] == 0 and np.isfinite(record["grad_norm"])
    assert record["logprob_mismatch_max"] < 1e-5
