"""One loader for every `module:name` field (registry.load_object): a user's module in
the working directory imports without PYTHONPATH, as TRL and verl users run their scripts;
"file.py:name" works; a module that is not found says where it was looked for."""

from __future__ import annotations

import sys

import pytest

from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import losses
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.envs.base import load_factory
from rlhf_jax.registry import load_object
from rlhf_jax.rewards import functions
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

# A user's module: an estimator, a policy loss, an environment factory, a reward function.
USER_MODULE = '''
import jax.numpy as jnp

def half(batch, token_rewards, algorithm, *, group_size):
  return (batch.scores - 0.5)[:, None] * batch.response_mask, None

def plain_pg(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg,
             agg_normalizer, agg_horizon, weights):
  per_token = -weights * advantages * jnp.exp(logprobs - old_logprobs)
  return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1), {}

class Env:
  def reset(self, example):
    return ""
  def step(self, action):
    raise NotImplementedError

def exact(prompts, completions, answer, **kwargs):
  return [float(c == a) for c, a in zip(completions, answer)]
'''


@pytest.fixture
def user_cwd(tmp_path, monkeypatch):
  """A working directory holding `<name>.py` (USER_MODULE), not on sys.path, the module
  not yet imported; sys.path and sys.modules restored afterwards."""
  name = f"user_module_{tmp_path.name}"
  (tmp_path / f"{name}.py").write_text(USER_MODULE)
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  yield name
  for key in [k for k in sys.modules if k == name or k.startswith("rlhf_jax_user_")]:
    del sys.modules[key]


def load(field: str, spec: str):
  """What the library makes of `spec` in `field` (the field's own loader)."""
  if field == "algorithm.advantage.estimator":
    return estimators.estimator(spec).fn
  if field == "algorithm.policy_loss.kind":
    return losses.policy_loss(spec).fn
  if field == "env.factory":
    return load_factory(spec)
  functions.load_callable.cache_clear()
  return functions.load_callable(spec)


FIELDS = [("algorithm.advantage.estimator", "half"), ("algorithm.policy_loss.kind", "plain_pg"),
          ("env.factory", "Env"), ("reward.function", "exact")]


@pytest.mark.parametrize("field, attribute", FIELDS)
@pytest.mark.parametrize("form", ["module", "file"])
def test_every_field_loads_from_the_working_directory(user_cwd, field, attribute, form):
  spec = f"{user_cwd}:{attribute}" if form == "module" else f"{user_cwd}.py:{attribute}"
  value = load(field, spec)
  assert value.__name__ == attribute and value.__module__ != __name__
  if form == "module":
    assert value is getattr(sys.modules[user_cwd], attribute)


def test_a_config_naming_an_estimator_in_the_working_directory_validates(user_cwd):
  config = base_config("arith")
  config.algorithm.advantage.estimator = f"{user_cwd}:half"
  validate_config(config, num_devices=1)


@pytest.mark.parametrize("field, _", FIELDS)
def test_a_missing_module_says_where_it_looked(user_cwd, tmp_path, field, _):
  with pytest.raises(ConfigError) as error:
    if field == "reward.function":
      config = base_config("arith")
      config.reward.function = "nowhere_xyz:fn"
      validate_config(config, num_devices=1)
    else:
      load(field, "nowhere_xyz:fn")
  message = str(error.value)
  assert message.startswith(f"config.{field}: invalid value 'nowhere_xyz:fn': its module "
                            "does not import: ModuleNotFoundError: no module named "
                            f"'nowhere_xyz' (searched the working directory {tmp_path} and "
                            "sys.path: ")
  assert sys.path[0].split("/")[-1] in message and "\n" not in message


def test_a_missing_submodule_names_its_package(user_cwd):
  with pytest.raises(ConfigError, match=r"no module named 'tests\.absent_xyz' \(searched "
                     r"package 'tests': .*tests"):
    load_object("tests.absent_xyz:fn", "env.factory")


def test_a_missing_file_and_a_failing_import_are_one_line(user_cwd, tmp_path):
  with pytest.raises(ConfigError, match=r"ModuleNotFoundError: no file 'absent\.py' \(looked "
                     f"for {tmp_path}/absent.py\\)"):
    load_object("absent.py:fn", "env.factory")
  (tmp_path / "broken.py").write_text("import no_such_dependency_xyz\n")
  with pytest.raises(ConfigError, match=r"ModuleNotFoundError: No module named "
                     r"'no_such_dependency_xyz'$"):  # the module's own import, as Python says
    load_object("broken:fn", "env.factory")


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # ml_collections'
def test_a_preset_file_imports_a_module_beside_it_without_pythonpath(user_cwd, tmp_path):
  """A learner or mode registers when its module is imported: from the user's preset."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel

  from rlhf_jax import cli  # pylint: disable=import-outside-toplevel
  (tmp_path / "my_preset.py").write_text(
      f"import {user_cwd}\n"
      "from rlhf_jax.training.config import base_config\n\n"
      "def get_config(variant='arith'):\n"
      "  c = base_config(variant)\n"
      f"  c.algorithm.advantage.estimator = '{user_cwd}:' + {user_cwd}.half.__name__\n"
      "  return c\n")
  argv = ["launcher", f"--config={tmp_path}/my_preset.py:arith"]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "preset", flag_values=values,
                                           lock_config=True, sys_argv=argv)
  cli.parse_flags(argv, values)
  assert holder.value.algorithm.advantage.estimator == f"{user_cwd}:half"
  validate_config(holder.value, num_devices=1)
