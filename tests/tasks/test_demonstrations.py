"""The arith and pycalc warm-start demonstrations (tasks/demonstrations.py): fresh problems
every step, the same ones for one seed and step, the answer-only form at `direct_fraction`,
worked solutions a verifier accepts, and pycalc programs that Python evaluates to the same
answers."""

from __future__ import annotations

import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import demonstrations

OPTIONS = dict(seed=7, batch_size=6, levels=(1, 2), weights=(0.5, 0.5), prompt_prefix=(),
               prompt_length=64, response_length=96)


@pytest.fixture
def encoded(monkeypatch):
  """The (prompts, responses) texts each `make_batch` call hands to `encode_pairs`."""
  calls = []

  def record(tokenizer, prompts, responses, **shapes):
    calls.append((list(prompts), list(responses)))
    return len(calls) - 1

  monkeypatch.setattr(batch_lib, "encode_pairs", record)
  return calls


def demonstrations_of(make_batch, encoded, step):
  return encoded[make_batch(step)]


def test_fresh_problems_every_step_the_same_for_one_step(encoded):
  make_batch = demonstrations.arith_sft_batches(arith.tokenizer(), **OPTIONS)
  first, again, second = (demonstrations_of(make_batch, encoded, s) for s in (0, 0, 1))
  assert first == again
  assert set(first[0]).isdisjoint(second[0])


def test_direct_answers_worked_solutions_and_programs_agree(encoded):
  tokenizer = arith.tokenizer()
  direct = demonstrations.arith_sft_batches(tokenizer, direct_fraction=1.0, **OPTIONS)
  worked = demonstrations.arith_sft_batches(tokenizer, **OPTIONS)
  programs = demonstrations.pycalc_sft_batches(tokenizer, **OPTIONS)
  for step in (0, 3):
    prompts, answers = demonstrations_of(direct, encoded, step)
    assert demonstrations_of(worked, encoded, step)[0] == prompts  # one problem stream
    assert all(a.startswith("Answer: ") and a.count("\n") == 0 for a in answers)
    numbers = [int(a.removeprefix("Answer: ")) for a in answers]
    _, solutions = demonstrations_of(worked, encoded, step)
    assert all("\n" in s and arith.verify(s, n) for s, n in zip(solutions, numbers))
    assert demonstrations_of(programs, encoded, step)[0] == prompts
    for program, number in zip(demonstrations_of(programs, encoded, step)[1], numbers):
      scope = {}
      exec(program, {}, scope)  # pylint: disable=exec-used
      assert scope["x"] == number


def test_a_careless_teacher_is_wrong_only_sometimes(encoded):
  careless = demonstrations.arith_sft_batches(arith.tokenizer(), slip_rate=1.0,
                                              **dict(OPTIONS, batch_size=40))
  direct = demonstrations.arith_sft_batches(arith.tokenizer(), direct_fraction=1.0,
                                            **dict(OPTIONS, batch_size=40))
  _, slipped = demonstrations_of(careless, encoded, 0)
  _, answers = demonstrations_of(direct, encoded, 0)
  right = [arith.verify(s, int(a.removeprefix("Answer: "))) for s, a in zip(slipped, answers)]
  assert 0 < sum(right) < len(right)  # problems without a carry stay right
