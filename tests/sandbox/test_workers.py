"""Reward functions as hostile code (rewards/functions.py, sandbox/workers.py `GroupPool`):
the processes a call starts die with the call, a worker past `reward.worker_memory_mb` is
replaced, results cross as plain data (a crafted object is never unpickled in the
trainer), and a flood of output is bounded. Runs in the adversarial suite's own PID
namespace (scripts/test.sh), each case bounded in time."""

import os
import time

import pytest

from rlhf_jax.data import Example
from rlhf_jax.rewards import functions
from rlhf_jax.rewards.function_scorer import FunctionScorer

pytestmark = pytest.mark.adversarial

FNS = "tests.sandbox.hostile_rewards"


def scorer(name, **kwargs):
  kwargs.setdefault("timeout_s", 10.0)
  return FunctionScorer(functions.parse_functions(f"{FNS}:{name}"), render_prompt=str,
                        encode=lambda text: [ord(c) for c in text], failure_score=-7.0,
                        workers=1, **kwargs)


def samples(count=2):
  return [Example(f"q{i}", "1", "t") for i in range(count)], ["a"] * count


def alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
  except OSError:
    return False


def gone_within(pid: int, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  while alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  return not alive(pid)


def test_the_processes_a_call_starts_die_when_it_returns():
  with scorer("leaves_a_process") as s:
    out = s.score(*samples())
    pid = int(out.scores[0])
    assert out.failures == ["", ""] and pid > 0
    assert gone_within(pid, 2.0)


def test_the_processes_of_a_call_that_times_out_die_with_its_worker(tmp_path, monkeypatch):
  pid_file = tmp_path / "pid"
  monkeypatch.setenv("HOSTILE_PID_FILE", str(pid_file))
  start = time.monotonic()
  with scorer("leaves_a_process_and_hangs", timeout_s=2.0) as s:
    out = s.score(*samples())
    assert out.failures[0].startswith("reward.function leaves_a_process_and_hangs: timeout "
                                      "after 2 s")
    assert gone_within(int(pid_file.read_text()), 2.0)
  assert time.monotonic() - start < 30


def test_a_worker_past_its_memory_limit_is_replaced_and_named():
  with scorer("eats_memory", memory_mb=300) as s:
    out = s.score(*samples())
    assert out.scores == [-7.0, -7.0]
    assert out.failures[0] == ("reward.function eats_memory: memory: its worker passed "
                               "reward.worker_memory_mb=300 MB (with the processes it "
                               "started)"), out.failures


@pytest.mark.parametrize("name", ["forged_result", "forged_numbers"])
def test_a_crafted_result_is_never_unpickled_by_the_trainer(name, tmp_path, monkeypatch):
  marker = tmp_path / "ran"
  monkeypatch.setenv("HOSTILE_MARKER", str(marker))
  with scorer(name) as s:
    out = s.score(*samples())
  assert not marker.exists()
  if name == "forged_numbers":  # a float subclass is a number: its value crosses as JSON
    assert out.scores == [1.0, 1.0]
  else:
    assert out.failures[0].startswith("reward.function forged_result: returned _Payload <")


def test_a_flood_of_output_is_counted_not_kept(caplog, capfd):
  with scorer("floods_stdout") as s:
    assert s.score(*samples()).scores == [1.0, 1.0]
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      metrics = s.pop_metrics()
  assert metrics["reward/floods_stdout/output_bytes"] == 50 * 2**20
  shown = "\n".join(caplog.messages)
  assert len(shown) < 5000
  captured = capfd.readouterr()
  assert len(captured.out) + len(captured.err) < 10_000


def test_a_pickle_sent_at_import_is_never_unpickled_by_the_trainer(tmp_path, monkeypatch):
  from rlhf_jax.sandbox.workers import WorkerStartError
  marker = tmp_path / "ran"
  monkeypatch.setenv("HOSTILE_MARKER", str(marker))
  # Built by hand: loading it here would run its import in the trainer (parse_functions
  # imports each module once to check its signature); only the worker's import is hostile.
  function = functions.RewardFunction("tests.sandbox.hostile_reward_import:score", "score",
                                      "trl")
  with FunctionScorer([function], render_prompt=str, encode=list, workers=1) as s, \
      pytest.raises(WorkerStartError, match="malformed start-up message"):
    s.score(*samples())
  assert not marker.exists()


def test_garbage_on_the_pipe_fails_the_call_not_the_run():
  with scorer("writes_garbage_to_its_pipe") as s:
    out = s.score(*samples())
    assert out.failures[0] == ("reward.function writes_garbage_to_its_pipe: worker sent a "
                               "malformed reply (not JSON)"), out.failures
    with scorer("leaves_a_process") as t:  # the pool goes on
      assert t.score(*samples()).failures == ["", ""]
