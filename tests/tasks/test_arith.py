"""The arith task (tasks/arith.py): solutions correct digit by digit, the slipping teacher,
the generator's levels, and the final-answer extraction."""

import re

import numpy as np
import pytest

from rlhf_jax.tasks import arith

LINE = re.compile(r"^(\d)([+\-*])(\d)([+\-])(\d)=(\d) ([cb])(\d)$")


def replay(solution: str) -> int:
  """Recomputes the answer from the digit lines alone, checking each line's arithmetic."""
  *lines, answer_line = solution.split("\n")
  digits = []
  for line in lines:
    a, op, b, sign, carry, digit, kind, out = LINE.match(line).groups()
    a, b, carry, digit, out = map(int, (a, b, carry, digit, out))
    value = {"+": a + b + carry, "-": a - b - carry, "*": a * b + carry}[op]
    if op == "-":
      assert (kind, sign) == ("b", "-") and digit == value % 10 and out == int(value < 0)
    else:
      assert kind == "c" and sign == "+" and (digit, out) == (value % 10, value // 10)
    digits.append(digit)
  assert answer_line.startswith("Answer: ")
  return int("".join(map(str, digits[::-1])))


@pytest.mark.parametrize("level", sorted(arith.LEVELS))
def test_solutions_are_correct_digit_by_digit(level):
  rng = np.random.default_rng(level)
  for _ in range(300):
    problem = arith.sample_problem(rng, level)
    assert replay(problem.solution) == problem.answer >= 0
    assert arith.verify(problem.solution, str(problem.answer))
    assert not arith.verify(problem.solution, str(problem.answer + 1))
    assert set(problem.prompt + problem.solution) <= set(arith.ALPHABET)


def carryless(problem) -> int:
  """The result of a teacher that drops every carry and borrow: each digit alone."""
  a = str(problem.a)[::-1]
  b = (str(problem.b) if problem.op != "*" else "")[::-1]
  width = max(len(a), len(b))
  a, b = a.ljust(width, "0"), b.ljust(width, "0")
  digit = {"+": lambda x, y: (x + y) % 10, "-": lambda x, y: (x - y) % 10,
           "*": lambda x, _: (x * problem.b) % 10}[problem.op]
  return int("".join(str(digit(int(x), int(y))) for x, y in zip(a, b))[::-1])


@pytest.mark.parametrize("level", sorted(arith.LEVELS))
def test_a_slipping_teacher_is_consistent_and_wrong_only_when_it_drops_a_carry(level):
  rng = np.random.default_rng(level)
  for _ in range(300):
    problem = arith.sample_problem(rng, level)
    assert arith.slipped_solution(problem, rng, 0.0) == problem.solution
    always = arith.slipped_solution(problem, rng, 1.0)
    assert replay(always) == carryless(problem) == int(always.rsplit(" ", 1)[1])
    sometimes = arith.slipped_solution(problem, rng, 0.5)
    answer = replay(sometimes)  # every line's arithmetic holds, and the answer line agrees
    assert int(sometimes.rsplit(" ", 1)[1]) == answer
    carried_lines = [line for line in problem.solution.split("\n")[:-1]
                     if not re.search(r"[+-]0=", line)]
    if not carried_lines:  # no carry to drop: the teacher cannot go wrong
      assert answer == problem.answer
  with pytest.raises(ValueError, match="slip_rate"):
    arith.slipped_solution(problem, rng, 1.5)


def test_generator_is_deterministic_and_levels_follow_weights():
  first = list(arith.generate(3, 50, levels=(1, 3), weights=(1.0, 0.0)))
  assert first == list(arith.generate(3, 50, levels=(1, 3), weights=(1.0, 0.0)))
  assert {p.level for p in first} == {1}
  assert max(p.a for p in first) < 100


def test_extract_answer_reads_only_a_final_answer_line():
  assert arith.extract_answer("x\nAnswer: 42") == "42"
  assert arith.extract_answer("Answer: 42\nmore text") is None
  assert arith.extract_answer("Answer: -7\n\n") == "-7"
  assert arith.extract_answer("") is None
  assert not arith.verify("Answer: 4x", "4")
