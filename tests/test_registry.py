"""The one plug-in table (rlhf_jax/registry.py): a user's name replaced and a built-in
never, the decorator form, one lookup by name or `module:name` from the working directory
with one-line errors that say where they looked and what is close, and every kind of
plug-in held in one."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Callable

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import invalid
from rlhf_jax.registry import Registry

FIELD = "algorithm.scorer"


@dataclasses.dataclass(frozen=True)
class Scorer:
  """A toy record: a function of (x, *, scale) and a capability."""
  name: str
  fn: Callable
  doubles: bool = False


def takes_x_and_scale(record: Scorer, name: str, field: str) -> None:
  try:
    inspect.signature(record.fn).bind(1.0, scale=2.0)
  except TypeError as error:
    invalid(field, name, f"its function must take (x, *, scale): {error}")


def table() -> Registry[Scorer]:
  """A fresh table with two built-ins, 'linear' and 'square'."""
  scorers = Registry("scorer", FIELD, Scorer, what="Scorer or function", wrap=Scorer,
                     check=takes_x_and_scale)
  scorers.register("linear", Scorer("linear", lambda x, *, scale: scale * x), built_in=True)
  scorers.register("square", Scorer("square", lambda x, *, scale: scale * x * x),
                   built_in=True)
  return scorers


def cube(x, *, scale):
  return scale * x ** 3


USER_MODULE = '''
from tests.test_registry import Scorer

def halve(x, *, scale):
  return scale * x / 2

HALVE = Scorer("halve", halve, doubles=True)
NOT_A_SCORER = 3

def wrong(x, y):
  return x + y
'''


@pytest.fixture(name="user_module")
def fixture_user_module(tmp_path, monkeypatch):
  """The name of a module in a fresh working directory that is not on sys.path."""
  name = f"user_scorers_{tmp_path.name}"
  (tmp_path / f"{name}.py").write_text(USER_MODULE)
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  yield name
  sys.modules.pop(name, None)


def message_of(call) -> str:
  with pytest.raises(ConfigError) as error:
    call()
  text = str(error.value)
  assert "\n" not in text and error.value.field == FIELD
  return text


def test_a_users_name_registered_again_is_replaced():
  scorers = table()
  first = scorers.register("cube", cube)  # a plain function, wrapped into the record
  assert first == Scorer("cube", cube) and scorers["cube"] is first
  second = scorers.register("cube", Scorer("cube", cube, doubles=True))
  assert scorers.resolve("cube") is second and scorers["cube"].doubles
  assert list(scorers) == ["linear", "square", "cube"]  # its place kept
  assert scorers.unregister("cube") is second and "cube" not in scorers


def test_a_built_in_is_never_replaced():
  scorers = table()
  linear = scorers["linear"]
  with pytest.raises(ValueError, match=r"^'linear' is a built-in scorer; register under "
                     r"another name$"):
    scorers.register("linear", cube)
  assert scorers.register("linear", linear) is linear  # the same record: nothing changes
  with pytest.raises(ValueError, match="'square' is not a scorer of one's own"):
    scorers.unregister("square")
  assert scorers.built_ins() == ("linear", "square")


@pytest.mark.parametrize("name", ["", "a:b"])
def test_a_name_is_not_a_module_path(name):
  with pytest.raises(ValueError, match="without ':'"):
    table().register(name, cube)


def test_a_record_under_another_name_or_of_another_type_is_refused():
  with pytest.raises(ValueError, match="a scorer registered as 'cube' is named 'other'"):
    table().register("cube", Scorer("other", cube))
  with pytest.raises(TypeError, match="a scorer is a Scorer, not int"):
    table().register("cube", 3)


def test_the_decorator_registers_and_returns_the_function():
  scorers = table()

  @scorers.register("quartic")
  def quartic(x, *, scale):
    return scale * x ** 4

  assert quartic(2.0, scale=1.0) == 16.0  # the function itself, still callable
  assert scorers.resolve("quartic").fn is quartic


def test_the_check_runs_on_registration_and_on_a_loaded_record(user_module):
  scorers = table()
  assert message_of(lambda: scorers.register("bad", lambda x, y: x)).startswith(
      f"config.{FIELD}: invalid value 'bad': its function must take (x, *, scale)")
  assert "bad" not in scorers
  assert message_of(lambda: scorers.resolve(f"{user_module}:wrong")).startswith(
      f"config.{FIELD}: invalid value '{user_module}:wrong': its function must take")


def test_an_unknown_name_lists_the_registered_ones_and_the_close_one():
  scorers = table()
  assert message_of(lambda: scorers.resolve("squre")) == (
      f"config.{FIELD}: invalid value 'squre': must be one of linear, square, or "
      "'package.module:name' (a Scorer or function; docs/extending.md); did you mean "
      "'square'?")
  assert message_of(lambda: scorers.resolve("zzz")).endswith("docs/extending.md)")
  assert message_of(lambda: scorers.resolve(None)).startswith(
      f"config.{FIELD}: invalid value None: must be one of linear, square")


def test_a_module_in_the_working_directory_is_loaded_without_pythonpath(user_module):
  scorers = table()
  record = scorers.resolve(f"{user_module}:HALVE")  # a record, as it is
  assert record is sys.modules[user_module].HALVE and record.doubles
  wrapped = scorers.resolve(f"{user_module}:halve")  # a function: wrapped, no capabilities
  assert wrapped == Scorer(f"{user_module}:halve", sys.modules[user_module].halve)
  assert scorers.resolve(f"{user_module}.py:halve").fn(4.0, scale=1.0) == 2.0  # a file


def test_a_missing_module_says_where_it_looked(user_module, tmp_path):
  del user_module
  text = message_of(lambda: table().resolve("nowhere_abc:HALVE"))
  assert text.startswith(
      f"config.{FIELD}: invalid value 'nowhere_abc:HALVE': its module does not import: "
      f"ModuleNotFoundError: no module named 'nowhere_abc' (searched the working directory "
      f"{tmp_path} and sys.path: ")


def test_a_missing_attribute_names_the_module_its_file_and_the_close_name(user_module):
  text = message_of(lambda: table().resolve(f"{user_module}:HALF"))
  assert text == (f"config.{FIELD}: invalid value '{user_module}:HALF': module "
                  f"'{user_module}' has no Scorer or function 'HALF' (looked in "
                  f"{user_module}.py); did you mean 'HALVE'?")
  text = message_of(lambda: table().resolve(f"{user_module}:NOT_A_SCORER"))
  assert f"has no Scorer or function 'NOT_A_SCORER' (it is a int) (looked in" in text


def test_a_kind_named_by_path_only_refuses_names():
  functions = Registry("reward function", "reward.function", Callable, what="function",
                       by_name=False)
  with pytest.raises(ValueError, match=r"named by 'package\.module:name' only"):
    functions.register("cube", cube)
  with pytest.raises(ConfigError, match=r"^config\.reward\.function: invalid value 'cube': "
                     r"must be 'package\.module:function' or 'path/to/file\.py:function'$"):
    functions.resolve("cube")
  assert functions.resolve("tests.test_registry:cube") is cube


def test_every_kind_of_plug_in_is_one_registry():
  from rlhf_jax.algorithms import estimators  # pylint: disable=import-outside-toplevel
  from rlhf_jax.algorithms import losses  # pylint: disable=import-outside-toplevel
  from rlhf_jax.algorithms import registry  # pylint: disable=import-outside-toplevel
  from rlhf_jax.envs import base  # pylint: disable=import-outside-toplevel
  from rlhf_jax.rewards import functions  # pylint: disable=import-outside-toplevel
  from rlhf_jax.rollout import modes  # pylint: disable=import-outside-toplevel
  from rlhf_jax.tasks import registry as tasks  # pylint: disable=import-outside-toplevel
  tables = (estimators.ESTIMATORS, losses.POLICY_LOSSES, registry.LEARNERS, modes.MODES,
            tasks.TASKS, base.ENVIRONMENTS, functions.REWARD_FUNCTIONS)
  assert all(type(t) is Registry for t in tables)
  assert [t.field for t in tables] == [
      "algorithm.advantage.estimator", "algorithm.policy_loss.kind", "algorithm.learner",
      "rollout.mode", "data.task", "env.factory", "reward.function"]


# ------------------------------------------------------------------ config sections

def _fields(**values):
  import ml_collections  # pylint: disable=import-outside-toplevel
  def build():
    return ml_collections.ConfigDict(values)
  return build


def test_build_config_puts_each_sections_fields_at_its_path_and_merges_a_shared_one():
  from rlhf_jax.registry import Section, build_config  # pylint: disable=import-outside-toplevel
  config = build_config((Section("root", at="", fields=_fields(seed=3)),
                         Section("train", at="train", fields=_fields(steps=5)),
                         Section("loggers", at="train", fields=_fields(loggers="x")),
                         Section("rule", check=lambda c, checking: None)))
  assert config.seed == 3 and config.train.steps == 5 and config.train.loggers == "x"
  assert sorted(config.keys()) == ["seed", "train"]


def test_a_field_two_sections_declare_is_refused_naming_both():
  from rlhf_jax.registry import Section, build_config  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match=r"'loggers' .*declares train.steps"):
    build_config((Section("train", at="train", fields=_fields(steps=5)),
                  Section("loggers", at="train", fields=_fields(steps=1))))


def test_checks_run_after_the_sections_they_read_else_in_table_order():
  from rlhf_jax.registry import Checking, Section, check_config  # pylint: disable=import-outside-toplevel
  ran = []
  def check(name):
    return lambda c, checking: ran.append(name)
  table = (Section("a", check=check("a"), after=("c",)), Section("b", check=check("b")),
           Section("c", check=check("c"), after=("b",)), Section("d", check=check("d")))
  check_config(None, table, Checking())
  assert ran == ["b", "c", "a", "d"]


def test_an_unknown_or_circular_after_is_refused():
  from rlhf_jax.registry import Section, check_order  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="unknown sections .'nope'"):
    check_order((Section("a", check=print, after=("nope",)),))
  with pytest.raises(ValueError, match="cycle"):
    check_order((Section("a", check=print, after=("b",)), Section("b", check=print,
                                                                   after=("a",))))
