"""Task curricula: parsing, exact per-phase task counts, the phase switch, resume."""

import collections

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.data.curriculum import CurriculumStream
from rlhf_jax.data.curriculum import Phase
from rlhf_jax.data.curriculum import allocate
from rlhf_jax.data.curriculum import parse_curriculum

EXAMPLES = [Example(f"{task}{i}", "0", task) for task in ("math", "code", "arith")
            for i in range(20)]


def tasks(batch):
  return dict(collections.Counter(e.task for e in batch))


def test_parse_curriculum():
  assert parse_curriculum("math:1,code:1@50; math:1, code:1, arith:2") == (
      Phase(50, (("math", 1.0), ("code", 1.0))),
      Phase(None, (("math", 1.0), ("code", 1.0), ("arith", 2.0))))
  assert parse_curriculum(" math:0.5 ") == (Phase(None, (("math", 0.5),)),)


@pytest.mark.parametrize("bad,message", [
    ("math:1@5", "every phase but the last ends with '@step', the last has none"),
    ("math:1; code:1", "every phase but the last"),
    ("math:1@; code:1", "step '' is not an integer"),
    ("math:1@5; code:1@3; arith:1", r"bounds must increase and be > 0 \(got 3 after 5\)"),
    ("math:1@5; code:1@5; arith:1", "bounds must increase"),
    ("math:1@0; code:1", "bounds must increase and be > 0"),
    ("math:1@x; code:1", "step 'x' is not an integer"),
    ("math:0", "'math:0' needs a task name and a finite weight > 0"),
    ("math:-1", "finite weight > 0"), ("math:inf", "finite weight > 0"),
    ("math:nan", "finite weight > 0"), (":1", "needs a task name"),
    ("math", "'math' is not 'task:weight'"), ("math:1,", "'' is not 'task:weight'"),
    ("", "expected phases"), ("math:1;", "expected phases"),
    ("math:1,math:2", "a task appears twice in phase 1"),
])
def test_bad_curricula_name_the_config_field(bad, message):
  with pytest.raises(ConfigError, match=f"^config.data.curriculum: invalid value .*{message}"):
    parse_curriculum(bad)


def test_allocate_uses_largest_remainders():
  # 10 × (1, 1, 2)/4 = 2.5, 2.5, 5: one extra prompt, to the first name of the tie.
  assert allocate(10, [("math", 1), ("code", 1), ("arith", 2)]) == {
      "math": 2, "code": 3, "arith": 5}
  # 7 × (1, 1, 1)/3 = 2.33 each: the tie of remainders goes to "a".
  assert allocate(7, [("a", 1), ("b", 1), ("c", 1)]) == {"a": 3, "b": 2, "c": 2}
  # 10 × (1, 3)/4 = 2.5, 7.5: equal remainders, "x" < "y".
  assert allocate(10, [("y", 1), ("x", 3)]) == {"y": 2, "x": 8}
  assert allocate(5, [("a", 3)]) == {"a": 5}
  assert allocate(0, [("a", 1), ("b", 1)]) == {"a": 0, "b": 0}


def test_allocate_carries_the_rounding_within_a_phase():
  # After code 4, math 3 of 7: 14 × 1/2 = 7 each, less what each got → code 3, math 4.
  assert allocate(7, [("math", 1), ("code", 1)], {"math": 3, "code": 4}) == {
      "math": 4, "code": 3}
  # One at a time at 1:1:2: arith, code, math, arith, ... (4 draws: 1, 1, 2 exactly).
  drawn, order = {}, []
  for _ in range(8):
    (task,) = [t for t, n in allocate(1, [("math", 1), ("code", 1), ("arith", 2)],
                                      drawn).items() if n]
    drawn[task] = drawn.get(task, 0) + 1
    order.append(task)
  assert order == ["arith", "code", "math", "arith"] * 2


def test_phases_give_exact_task_counts_and_switch_at_the_bound():
  stream = CurriculumStream(EXAMPLES, parse_curriculum("math:1,code:1@2; math:1,code:1,arith:2"),
                            seed=0)
  for step in (0, 1):  # phase 1 holds for steps 0 and 1
    stream.set_step(step)
    assert tasks(stream.take(6)) == {"math": 3, "code": 3}
  assert stream.pop_mix() == {"math": 6, "code": 6}
  stream.set_step(2)  # the bound: phase 2 from step 2 on
  assert tasks(stream.take(8)) == {"math": 2, "code": 2, "arith": 4}
  assert stream.pop_mix() == {"math": 2, "code": 2, "arith": 4}
  stream.set_step(1000)
  assert tasks(stream.take(4)) == {"math": 1, "code": 1, "arith": 2}


def test_fractional_takes_alternate_instead_of_favouring_one_name():
  stream = CurriculumStream(EXAMPLES, parse_curriculum("math:1,code:1@2; math:1,arith:1"))
  mixes = []
  for step in range(4):
    stream.set_step(step)
    stream.take(7)
    mixes.append(stream.pop_mix())
  # Phase 1: 4/3 then 3/4 (the carry); phase 2 starts afresh: arith < math wins the tie.
  assert mixes == [{"code": 4, "math": 3}, {"code": 3, "math": 4},
                   {"arith": 4, "math": 3}, {"arith": 3, "math": 4}]


def test_a_task_stream_does_not_depend_on_the_other_tasks():
  alone = CurriculumStream(EXAMPLES, parse_curriculum("math:1"), seed=3).take(5)
  mixed = CurriculumStream(EXAMPLES, parse_curriculum("math:1,code:1"), seed=3).take(10)
  assert sorted(e.prompt for e in alone) == sorted(e.prompt for e in mixed if e.task == "math")


def test_missing_tasks_and_foreign_states_are_errors():
  with pytest.raises(ConfigError, match=r"config.data.curriculum: names "
                     r"task\(s\) \['proof'\] "
                     r"that have no examples in the data \(tasks there: \['arith', 'code', "
                     r"'math'\]\)"):
    CurriculumStream(EXAMPLES, parse_curriculum("proof:1,math:1"))
  curriculum = CurriculumStream(EXAMPLES, parse_curriculum("math:1"))
  plain = PromptStream(EXAMPLES)
  with pytest.raises(ValueError, match="not a CurriculumStream state"):
    curriculum.restore(plain.state())
  with pytest.raises(ValueError, match="not a PromptStream state"):
    plain.restore(curriculum.state())


def test_prompt_stream_counts_the_tasks_it_gave_since_the_last_pop():
  stream = PromptStream(EXAMPLES, shuffle=False)
  stream.set_step(5)  # no-op
  stream.take(25)
  assert stream.pop_mix() == {"math": 20, "code": 5}
  stream.take(3)
  stream.take(1)
  assert stream.pop_mix() == {"code": 4}
  assert stream.pop_mix() == {}


@pytest.mark.parametrize("make", [
    lambda: CurriculumStream(EXAMPLES, parse_curriculum("math:1@3; math:1,arith:1,code:1"),
                             seed=4),
    lambda: CurriculumStream(EXAMPLES, parse_curriculum("math:1,code:2"), seed=4,
                             shuffle=False),
    lambda: PromptStream(EXAMPLES, seed=4)])
def test_resume_continues_exactly(make):
  stream = make()
  for step in range(3):
    stream.set_step(step)
    stream.take(7)
  saved = stream.state()
  expected = []
  for step in range(3, 9):  # crosses the phase bound and the 20-example epochs
    stream.set_step(step)
    expected.append([e.prompt for e in stream.take(7)])
  resumed = make()
  resumed.restore(saved)
  got = []
  for step in range(3, 9):
    resumed.set_step(step)
    got.append([e.prompt for e in resumed.take(7)])
  assert got == expected
