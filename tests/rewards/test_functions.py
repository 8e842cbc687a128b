"""Reward functions of one's own (rewards/functions.py): TRL's and verl's conventions told
apart by parameter names, weights, and loading errors that name the field before any work."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rewards import functions
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

FNS = "tests.rewards.reward_fns"


def test_conventions_are_told_apart_by_parameter_names():
  assert [f.convention for f in functions.parse_functions(
      f"{FNS}:solution_match,{FNS}:compute_score,{FNS}:async_length")] == ["trl", "verl", "trl"]
  parsed = functions.parse_functions(f"{FNS}:only_short,{FNS}:only_short", "1,0.5")
  assert [(f.name, f.weight) for f in parsed] == [("only_short", 1.0), ("only_short_2", 0.5)]


@pytest.mark.parametrize("spec, weights, message", [
    ("nocolon", "", r"config.reward.function: invalid value 'nocolon': must be "
                    r"'package.module:function'"),
    ("no_such_module_xyz:f", "", r"its module does not import: ModuleNotFoundError: no "
                                 r"module named 'no_such_module_xyz' \(searched the working "
                                 r"directory /.* and sys.path: "),
    (f"{FNS}:missing", "", r"module 'tests.rewards.reward_fns' has no function 'missing'"),
    (f"{FNS}:NOT_CALLABLE", "", r"has no function 'NOT_CALLABLE' \(it is a int\)"),
    (f"{FNS}:no_convention", "", r"takes \(text\): neither TRL's"),
    ("/nonexistent/r.py:f", "", r"no file '/nonexistent/r.py'"),
    (f"{FNS}:raises", "1,2", r"config.reward.function_weights: invalid value '1,2': 2 weights "
                             r"for 1 functions"),
    (f"{FNS}:raises", "x", r"config.reward.function_weights: invalid value 'x': weights 'x' "
                           r"must be numbers"),
])
def test_loading_errors_name_the_field_before_any_work(spec, weights, message):
  c = base_config("arith")
  c.reward.function, c.reward.function_weights = spec, weights
  with pytest.raises(ConfigError, match=message):
    validate_config(c)


def test_weights_without_a_function_and_a_function_with_a_model_route_are_refused():
  c = base_config("arith")
  c.reward.function_weights = "1"
  with pytest.raises(ConfigError, match="config.reward.function_weights: .* must be empty"):
    validate_config(c)
  c = base_config("arith")
  c.reward.function, c.reward.route = f"{FNS}:raises", "rm"
  c.reward.rm.checkpoint = ""
  with pytest.raises(ConfigError, match="config.reward"):
    validate_config(c)
