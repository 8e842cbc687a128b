"""Environments in killable workers (envs/runner.py): state carried across calls, and a
raising, hanging or malformed environment ends only its own episode with a reason."""

import os
import signal
import subprocess
import sys
import time

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


@pytest.mark.parametrize("name, reason, kind", [
    ("Raising", "RuntimeError: the tool broke on 'go'", "runtime_error"),
    ("Hanging", "timeout after 1 s", "timeout"),
    ("Malformed", "TypeError: step returned dict, not rlhf_jax.envs.StepResult", "type_error"),
    ("NaNReward", "NonFiniteReward: StepResult.reward=nan is not a number finite in float32",
     "non_finite_reward"),
    # Finite for math.isfinite, inf in float32 (the batch's dtype).
    ("InfReward", "NonFiniteReward: StepResult.reward=1e+39 is not a number finite in "
     "float32", "non_finite_reward"),
])
def test_a_failing_environment_ends_only_its_episode(name, reason, kind):
  runner = EnvironmentRunner(f"{MODULE}:{name}", workers=1, timeout_s=1.0)
  healthy = EnvironmentRunner(f"{MODULE}:Countdown", workers=1, timeout_s=5.0)
  try:
    bad, good = runner.start(["x"])[0], healthy.start(["y"])[0]
    failed = runner.step([bad.env, bad.env], ["go", "go"])
    assert [(o.env, o.result, o.failure, o.kind) for o in failed] == [
        (None, None, reason, kind)] * 2
    again = runner.start(["z"])[0]  # the pool lives on
    assert not again.failure and again.result in ("count to 3 (z)", "")
    assert healthy.step([good.env], ["on"])[0].result.reward == 1.0
  finally:
    runner.close()
    healthy.close()


def test_an_environment_slow_to_import_is_imported_at_start_up_not_in_a_resets_time():
  """The workers import the factory's module as they start: its 2 s are not the first
  reset's, whose limit is 1 s."""
  runner = EnvironmentRunner("tests.envs.slow_import_environment:SlowToImport", workers=1,
                             timeout_s=1.0)
  try:
    (started,) = runner.start(["a"])
    assert (started.failure, started.result) == ("", "count to 3 (a)")
  finally:
    runner.close()


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


def test_the_worker_cuts_an_observation_to_its_budget(monkeypatch):
  monkeypatch.setenv("RLHF_JAX_HUGE_CHARS", "3000000")  # read by the worker it starts
  runner = EnvironmentRunner(f"{MODULE}:Huge", workers=1, timeout_s=10.0)
  try:
    first = runner.start(["x"], max_chars=[5])[0]
    stepped = runner.step([first.env, first.env], ["a", "b"], max_chars=[1000, 3_000_000])
  finally:
    runner.close()
  assert (first.result, first.cut) == ("", 0)
  text = "the cat sat on the mat " * 44
  assert (stepped[0].result.observation, stepped[0].cut) == (text[:1000], 3_000_000 - 1000)
  assert (len(stepped[1].result.observation), stepped[1].cut) == (3_000_000, 0)


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie waiting for its reaper does not)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except OSError:
    return False


def _gone_within(pid: int, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  return not _alive(pid)


def test_processes_an_environment_starts_die_with_its_worker():
  runner = EnvironmentRunner(f"{MODULE}:Spawning", workers=1, timeout_s=2.0)
  hanging = EnvironmentRunner(f"{MODULE}:SpawningThenHanging", workers=1, timeout_s=1.0)
  try:
    env = runner.start(["x"])[0].env
    child = int(runner.step([env], ["go"])[0].result.observation)
    assert _alive(child)  # between calls it lives (the environment may use it)
    stuck = hanging.start(["x"])[0].env
    worker = hanging.pool._workers[0].process.pid  # pylint: disable=protected-access
    assert hanging.step([stuck], ["go"])[0].kind == "timeout"
    # The killed worker's group went with it: its sleep too.
    assert not any(_alive(pid) for pid in _group(worker))
  finally:
    runner.close()
    hanging.close()
  assert _gone_within(child, 2.0)


def _group(pgid: int) -> list[int]:
  from rlhf_jax.sandbox import worker_groups as processes  # pylint: disable=import-outside-toplevel
  return [pid for pid, _ in processes.group_members(pgid)]


TRAINER = """
import os, signal, sys
from rlhf_jax.envs import EnvironmentRunner
if __name__ == "__main__":
  runner = EnvironmentRunner("tests.envs.environments:Spawning", workers=1, timeout_s=5.0)
  env = runner.start(["x"])[0].env
  print(runner.step([env], ["go"])[0].result.observation, flush=True)
  os.kill(os.getpid(), signal.SIGKILL)  # no close, no clean-up
"""


def test_a_killed_trainer_takes_its_environments_processes_with_it(tmp_path):
  script = tmp_path / "trainer.py"
  script.write_text(TRAINER)
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  out = tmp_path / "out"
  with open(out, "w") as f:  # a file, not a pipe: a surviving sleep would hold a pipe open
    code = subprocess.run([sys.executable, str(script)], stdout=f, stderr=subprocess.STDOUT,
                          timeout=120, env=env, check=False).returncode
  assert code == -signal.SIGKILL, out.read_text()[-2000:]
  child = int(out.read_text().split()[-1])
  assert _gone_within(child, 3.0)  # the worker's watchdog saw its trainer go


def test_a_worker_past_its_memory_limit_is_replaced(monkeypatch):
  monkeypatch.setenv("RLHF_JAX_HOG_MB", "150")  # read by the worker it starts
  runner = EnvironmentRunner(f"{MODULE}:Hog", workers=1, timeout_s=10.0, memory_mb=250)
  try:
    env = runner.start(["x"])[0].env
    first = runner.step([env], ["a"])[0]
    assert (first.failure, first.result.observation) == ("", " held 1")
    second = runner.step([first.env], ["b"])[0]  # 300 MB held: past the limit
    assert (second.kind, second.failure) == (
        "memory", "memory: the worker passed env.worker_memory_mb=250 MB")
    third = runner.step([first.env], ["c"])[0]  # a new worker, its memory fresh
    assert (third.failure, third.result.observation) == ("", " held 1")
  finally:
    runner.close()


def test_memory_of_the_processes_an_environment_starts_counts(capfd):
  runner = EnvironmentRunner(f"{MODULE}:ChildHog", workers=1, timeout_s=20.0, memory_mb=250)
  try:
    env = runner.start(["x"])[0].env
    outcome = runner.step([env], ["a"])[0]
  finally:
    runner.close()
  assert outcome.kind == "memory"
  child = int(capfd.readouterr().out.split()[-1])  # the worker printed it before it ended
  assert _gone_within(child, 2.0)
