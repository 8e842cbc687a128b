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


def test_parse_curriculum():
  assert parse_curriculum("math:1,code:1@50; math:1, code:1, arith:2") == (
      Phase(50, (("math", 1.0), ("code", 1.0))),
      Phase(None, (("math", 1.0), ("code", 1.0), ("arith", 2.0))))
  for bad, message in [("math:1@5", "every phase but the last"),
                       ("math:1; code:1", "every phase but the last"),
                       ("math:1@5; code:1@3; arith:1", "bounds must increase"),
                       ("math:0", "weight > 0"), ("math", "not 'task:weight'"),
                       ("math:1@x; code:1", "not an integer"), ("", "expected phases"),
                       ("math:1,math:2", "appears twice")]:
    with pytest.raises(ConfigError, match=f"config.data.curriculum=.*{message}"):
      parse_curriculum(bad)


def test_allocate_uses_largest_remainders():
  # 10 × (1, 1, 2)/4 = 2.5, 2.5, 5: one extra prompt, to the first name of the tie.
  assert allocate(10, [("math", 1), ("code", 1), ("arith", 2)]) == {
      "math": 2, "code": 3, "arith": 5}
  assert allocate(7, [("a", 1), ("b", 1), ("c", 1)]) == {"a": 3, "b": 2, "c": 2}
  assert allocate(5, [("a", 3)]) == {"a": 5}


def test_phases_give_exact_task_counts_and_switch_at_the_bound():
  stream = CurriculumStream(EXAMPLES, parse_curriculum("math:1,code:1@2; math:1,code:1,arith:2"),
                            seed=0)
  for step in (0, 1):
    stream.set_step(step)
    batch = stream.take(6)
    assert collections.Counter(e.task for e in batch) == {"math": 3, "code": 3}
  assert stream.pop_mix() == {"math": 6, "code": 6}
  stream.set_step(2)
  batch = stream.take(8)
  assert collections.Counter(e.task for e in batch) == {"math": 2, "code": 2, "arith": 4}
  assert stream.pop_mix() == {"math": 2, "code": 2, "arith": 4}
  with pytest.raises(ConfigError, match=r"task\(s\) \['proof'\] that have no examples"):
    CurriculumStream(EXAMPLES, parse_curriculum("proof:1"))


@pytest.mark.parametrize("make", [
    lambda: CurriculumStream(EXAMPLES, parse_curriculum("math:1@3; math:1,arith:1"), seed=4),
    lambda: PromptStream(EXAMPLES, seed=4)])
def test_resume_continues_exactly(make):
  stream = make()
  for step in range(3):
    stream.set_step(step)
    stream.take(7)
  saved = stream.state()
  expected = []
  for step in range(3, 6):
    stream.set_step(step)
    expected.append([e.prompt for e in stream.take(7)])
  resumed = make()
  resumed.restore(saved)
  got = []
  for step in range(3, 6):
    resumed.set_step(step)
    got.append([e.prompt for e in resumed.take(7)])
  assert got == expected
