"""One trainer per workdir (run_control.WorkdirLock) and signals that wait for the step's
records (run_control.StopSignals)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rlhf_jax import cli
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import loop
from rlhf_jax.training import run_control
from tests.training.runs import preset
from tests.training.runs import scorer
from tests.training.runs import shrink


def test_signals_set_a_flag_and_a_second_sigint_interrupts():
  before = signal.getsignal(signal.SIGINT)
  with run_control.StopSignals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)
    assert (signals.requested, signals.code) == ("SIGTERM", 143)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_to_the_process_group_does_not_kill_a_reward_call_in_flight():
  from rlhf_jax.sandbox.workers import KillablePool
  pool = KillablePool(1, timeout_s=30)
  assert pool.map([(time.sleep, (0.0,))]) == [("ok", None)]  # started
  worker = pool._workers[0].process  # pylint: disable=protected-access
  timer = threading.Timer(0.5, os.kill, (worker.pid, signal.SIGINT))  # as a terminal does
  timer.start()
  try:
    assert pool.map([(time.sleep, (1.5,))]) == [("ok", None)]  # the step's scores stand
  finally:
    timer.join()
    pool.close()


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
  first, second = run_control.WorkdirLock(str(tmp_path)), run_control.WorkdirLock(str(tmp_path))
  first.acquire()
  with pytest.raises(run_control.WorkdirBusy) as error:
    second.acquire()
  message = str(error.value)
  assert message.startswith(f"--workdir={tmp_path}: in use by another trainer (pid "
                            f"{os.getpid()} on host ")
  assert isinstance(error.value, ConfigError) and "\n" not in message
  first.release()
  second.acquire()  # free again
  second.release()


def test_a_workdir_that_is_a_file_is_one_error(tmp_path):
  (tmp_path / "run").write_text("")
  with pytest.raises(ConfigError, match=rf"^--workdir={tmp_path / 'run'}: cannot hold the "
                     "run's lock file: "):
    run_control.WorkdirLock(str(tmp_path / "run")).acquire()


def test_a_live_process_holds_the_lock_and_a_dead_one_does_not(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from rlhf_jax.training import run_control; "
       f"lock = run_control.WorkdirLock({str(tmp_path)!r}); lock.acquire(); "
       "print('held', flush=True); "
       "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(run_control.WorkdirBusy, match=f"pid {holder.pid} on host"):
      run_control.WorkdirLock(str(tmp_path)).acquire()
  finally:
    holder.kill()
    holder.wait()
  lock = run_control.WorkdirLock(str(tmp_path))  # the file is still there, naming the dead
  lock.acquire()
  lock.release()


def test_a_trainer_is_refused_before_any_work_and_the_launcher_says_so_in_one_line(
    tmp_path, capsys, monkeypatch):
  held = run_control.WorkdirLock(str(tmp_path))
  held.acquire()
  config = shrink(preset("grpo"))
  # The workdir has no policy: anything but the lock's refusal would be another error.
  with pytest.raises(run_control.WorkdirBusy):
    loop.Trainer(config, str(tmp_path), log=print, scorer=scorer(config))

  def main(argv):
    del argv
    loop.Trainer(config, str(tmp_path), log=print, scorer=scorer(config))

  with pytest.raises(SystemExit) as exit_status:
    monkeypatch.setattr(sys, "argv", ["train.py"])
    cli.run(main)
  assert exit_status.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f"error: --workdir={tmp_path}: in use by another trainer (pid ")
  assert "\n" not in err
  held.release()


def test_a_trainer_takes_over_its_launchers_lock_and_gives_it_back(tmp_path):
  lock = run_control.WorkdirLock(str(tmp_path))
  lock.acquire()  # as a launcher does before the warm start
  config = shrink(preset("grpo"))
  with pytest.raises(ConfigError, match="no policy checkpoint"):  # past the lock
    loop.Trainer(config, str(tmp_path), log=print, scorer=scorer(config), lock=lock)
  assert lock.file is None  # released with the failed trainer


def test_overwrite_refuses_to_remove_an_input_the_config_reads(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "policy").mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text("{}\n")
  lock = run_control.WorkdirLock(str(workdir))
  lock.acquire()
  try:
    with pytest.raises(ConfigError, match=r"config\.model\.checkpoint: .* is in 'policy' of "
                                          r"--workdir=.*which --overwrite would remove"):
      run_control.start_over(str(workdir), lock,
                             inputs={"model.checkpoint": str(workdir / "policy")})
    assert (workdir / "metrics.jsonl").exists()  # refused before anything was removed
    removed = run_control.start_over(str(workdir), lock,
                                     inputs={"data.train_file": str(tmp_path / "x.jsonl")})
    assert set(removed) == {"policy", "metrics.jsonl"}
  finally:
    lock.release()
