"""What every launcher shares (rlhf_jax/cli.py), function by function on a small config:
the `--config.<path>` overrides read from argv, the last of repeated ones winning, unknown
fields named with their close matches or the section that has them, config files checked
before they load, and the process settings (compile cache, deterministic GPU ops, the
working directory on the path). The launchers' one-line errors end to end:
tests/launch/test_launcher_errors.py and tests/training/test_config.py."""

from __future__ import annotations

import os
import sys

import ml_collections
import pytest

from rlhf_jax import cli
from rlhf_jax.config_errors import ConfigError


def small_config():
  return ml_collections.ConfigDict({
      "rollout": {"temperature": 1.0, "group_size": 8, "stop_at_eos": True},
      "train": {"steps": 10, "buckets": (64,)},
      "sampler": {"temperature": 0.5}})


def test_overrides_are_read_in_order_with_their_forms():
  argv = ["--config=configs/grpo.py:arith", "--config.train.steps=3", "-config.rollout.group_size",
          "4", "--noconfig.rollout.stop_at_eos", "--other.train.steps=1", "--config.a=b=c"]
  assert cli.config_overrides(argv) == [
      cli.Override("config", "train.steps", "3", False, 1),
      cli.Override("config", "rollout.group_size", None, False, 2),
      cli.Override("config", "rollout.stop_at_eos", None, True, 4),
      cli.Override("config", "a", "b=c", False, 6)]
  assert [o.path for o in cli.config_overrides(argv, "other")] == ["train.steps"]


def test_the_last_of_repeated_overrides_wins_with_its_value_argument():
  config = small_config()
  argv = ["--config.train.buckets=(64,)", "--config.rollout.group_size", "4",
          "--config.train.buckets=(112,)", "--config.rollout.group_size=2",
          "--config.rollout.stop_at_eos", "--noconfig.rollout.stop_at_eos"]
  assert cli.last_wins(argv, config, cli.config_overrides(argv)) == [
      "--config.train.buckets=(112,)", "--config.rollout.group_size=2",
      "--noconfig.rollout.stop_at_eos"]


@pytest.mark.parametrize("path, message", [
    ("rollout.temprature", r"^config\.rollout\.temprature: unknown field.*temperature"),
    ("train.steps.max", r"^config\.train\.steps\.max: unknown field.*config\.train\.steps is a "
                        r"value \(int\), not a section"),
    ("group_size", r"^config\.group_size: unknown field.*did you mean "
                   r"'config\.rollout\.group_size'\?"),
    ("variant", r"^config\.variant: unknown field.*the variant is now the preset's overlay"),
])
def test_an_unknown_field_is_named_with_a_hint(path, message):
  with pytest.raises(ConfigError, match=message) as error:
    cli.check_overrides(small_config(), cli.config_overrides([f"--config.{path}=1"]))
  assert "\n" not in str(error.value)
  cli.check_overrides(small_config(), cli.config_overrides(["--config.train.steps=1"]))


def test_config_files_are_checked_before_they_load(tmp_path):
  cli.check_config_file("configs/grpo.py:arith")
  broken = tmp_path / "broken.py"
  broken.write_text("def get_config(:\n  pass\n")
  for spec, message in [("", r"no config file given"),
                        (f"{tmp_path}/nope.py", r"no such file"),
                        (str(tmp_path), r"is a directory"),
                        (f"{tmp_path}/c.json", r"no such file"),
                        (str(broken), rf"{broken}:1: syntax error")]:
    with pytest.raises(ConfigError, match=rf"^--config={spec}: .*{message}"):
      cli.check_config_file(spec)
  (tmp_path / "c.json").write_text("{}")
  with pytest.raises(ConfigError, match=r"is not a Python config file"):
    cli.check_config_file(f"{tmp_path}/c.json")


def test_the_compile_cache_directory_and_deterministic_gpu_ops(monkeypatch):
  monkeypatch.setenv("RLHF_JAX_COMPILE_CACHE", "/tmp/cache_from_env")
  assert cli.compile_cache_dir(None) == "/tmp/cache_from_env"
  assert cli.compile_cache_dir(ml_collections.ConfigDict({"compile_cache": ""})) == ""
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
  cli.enable_deterministic_gpu_ops()
  cli.enable_deterministic_gpu_ops()  # once only
  assert os.environ["XLA_FLAGS"] == "--xla_foo=1 --xla_gpu_deterministic_ops=true"


def test_the_working_directory_goes_last_on_the_path(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  cli.working_directory_on_path()
  cli.working_directory_on_path()
  assert sys.path[-1] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
