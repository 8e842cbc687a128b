"""Environments in killable workers (envs/runner.py): state carried across calls, and a
raising, hanging or malformed environment ends only its own episode with a reason."""

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.envs import Environment
from rlhf_jax.envs import EnvironmentRunner
from rlhf_jax.envs import StepResult

MODULE = "tests.envs.environments"


@pytest.fixture(scope="module")
def runner():
  runner = EnvironmentRunner(f"{MODULE}:Countdown", workers=2, timeout_s=5.0)
  yield runner
  runner.close()


def test_episodes_keep_their_state_across_calls(runner):
  started = runner.start(["a", "b", "c"])
  assert [o.result for o in started] == [f"count to 3 ({x})" for x in "abc"]
  assert all(isinstance(o.env, Environment) and not o.failure for o in started)
  envs = [o.env for o in started]
  for turn in (1, 2, 3):
    outcomes = runner.step(envs, [f"{x}{turn}" for x in "abc"])
    envs = [o.env for o in outcomes]
    for x, outcome in zip("abc", outcomes):
      assert outcome.result == StepResult(
          observation=f" turn {turn} of 3: {[f'{x}{t}' for t in range(1, turn + 1)]}",
          reward=float(turn), done=turn == 3)
  assert [env.seen for env in envs] == [[f"{x}{t}" for t in (1, 2, 3)] for x in "abc"]


@pytest.mark.parametrize("name, reason", [
    ("Raising", "RuntimeError: the tool broke on 'go'"),
    ("Hanging", "timeout after 1 s"),
    ("Malformed", "TypeError: step returned dict, not rlhf_jax.envs.StepResult"),
    ("NaNReward", "TypeError: StepResult.reward=nan is not a finite number"),
])
def test_a_failing_environment_ends_only_its_episode(name, reason):
  runner = EnvironmentRunner(f"{MODULE}:{name}", workers=1, timeout_s=1.0)
  healthy = EnvironmentRunner(f"{MODULE}:Countdown", workers=1, timeout_s=5.0)
  try:
    bad, good = runner.start(["x"])[0], healthy.start(["y"])[0]
    failed = runner.step([bad.env, bad.env], ["go", "go"])
    assert [(o.env, o.result, o.failure) for o in failed] == [(None, None, reason)] * 2
    assert runner.start(["z"])[0].result == "count to 3 (z)"  # the pool lives on
    assert healthy.step([good.env], ["on"])[0].result.reward == 1.0
  finally:
    runner.close()
    healthy.close()


@pytest.mark.parametrize("path, match", [
    ("no_colon", "must be 'package.module:callable'"),
    ("tests.envs.missing_module:X", "its module does not import: ModuleNotFoundError"),
    (f"{MODULE}:Absent", "has no callable 'Absent'"),
    (f"{MODULE}:NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
])
def test_a_bad_factory_is_named_before_any_work(path, match):
  with pytest.raises(ConfigError, match="env.factory") as error:
    EnvironmentRunner(path, workers=1, timeout_s=1.0)
  assert match in str(error.value)
