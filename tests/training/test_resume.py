"""Resume that survives what happens to a run's workdir: torn record files, a
corrupt latest checkpoint, SIGINT mid-step, a lost fleet (the lock and the signal flag:
test_workdir_lock.py).

The end-to-end cases compare against one uninterrupted 4-step GRPO run (checkpoints at
2 and 4, an evaluation every step), as test_loop.test_resume_continues_exactly does."""

import gc
import glob
import json
import os
import shutil
import signal
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import build
from rlhf_jax.training import loop
from rlhf_jax.training import run_control
from rlhf_jax.training.checkpoint import Checkpointer
from rlhf_jax.training.metrics import truncate_jsonl
from tests.training.runs import preset
from tests.training.runs import TIMING
from tests.training.runs import make_trainer
from tests.training.runs import records
from tests.training.runs import scorer
from tests.training.runs import shrink

# ------------------------------------------------------------------ torn record files


def test_a_torn_last_line_is_dropped_with_a_warning_naming_the_file(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
  lines = []
  truncate_jsonl(str(path), 2, lines.append)
  assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
  assert len(lines) == 1 and str(path) in lines[0] and "torn last line 3" in lines[0]


def test_a_complete_last_line_without_its_newline_gets_one(tmp_path):
  path = tmp_path / "rollouts.jsonl"
  path.write_text('{"step": 1}\n{"step": 2}')
  truncate_jsonl(str(path), 5, lambda line: pytest.fail(line))
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'  # the next append starts a line


def test_a_crash_while_dropping_later_steps_leaves_the_records_whole(tmp_path, monkeypatch):
  from rlhf_jax.training import metrics as metrics_lib
  path = tmp_path / "metrics.jsonl"
  text = '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
  path.write_text(text)

  class DiskFull:
    """A file open for writing whose disk fills after its first line."""

    def __init__(self, f):
      self.f = f

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.f.close()

    def writelines(self, lines):
      self.f.write(lines[0])
      self.f.flush()
      raise OSError(28, "No space left on device")

  def full_disk_open(file, mode="r", **kwargs):
    f = open(file, mode, **kwargs)  # pylint: disable=consider-using-with
    return DiskFull(f) if "w" in mode else f

  monkeypatch.setattr(metrics_lib, "open", full_disk_open, raising=False)
  with pytest.raises(OSError, match="No space"):
    truncate_jsonl(str(path), 2, print)
  assert path.read_text() == text and os.listdir(tmp_path) == ["metrics.jsonl"]
  monkeypatch.undo()
  truncate_jsonl(str(path), 2, print)
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


@pytest.mark.parametrize("middle", ['{"step": 2, "a"', '{"a": 2}', "[]", ""])
def test_a_malformed_earlier_line_is_one_error_naming_file_and_line(tmp_path, middle):
  path = tmp_path / "metrics.jsonl"
  path.write_text(f'{{"step": 1}}\n{middle}\n{{"step": 3}}\n')
  with pytest.raises(ConfigError, match=rf"^{path}: line 2 is not a record") as error:
    truncate_jsonl(str(path), 5, print)
  assert "\n" not in str(error.value)


# ------------------------------------------------------------------ corrupt checkpoints

STATE = {"a": jnp.arange(1000.0), "b": {"c": jnp.ones((3, 4))}}


def corrupt(kind: str, step_dir: str) -> None:
  """Damages a saved checkpoint directory the way a crash or a careless hand does."""
  data = glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*"))
  if kind == "truncated_array":
    with open(max(data, key=os.path.getsize), "r+b") as f:
      f.truncate(100)
  elif kind == "removed_arrays":
    for path in data:
      os.remove(path)
  elif kind == "garbage_metadata":
    with open(os.path.join(step_dir, "state", "_METADATA"), "w") as f:
      f.write("\x00garbage{")
  elif kind == "empty_step_directory":
    shutil.rmtree(step_dir)
    os.makedirs(step_dir)
  elif kind == "missing_meta":
    os.remove(os.path.join(step_dir, "meta", "metadata"))
  else:
    raise ValueError(kind)


KINDS = ("truncated_array", "removed_arrays", "garbage_metadata", "empty_step_directory",
         "missing_meta")


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
  directory = tmp_path_factory.mktemp("saved")
  checkpointer = Checkpointer(str(directory))
  for step in (2, 4):
    checkpointer.save(step, jax.tree.map(lambda x, s=step: x + s, STATE), {"step": step})
  checkpointer.close()
  return directory


@pytest.fixture()
def frozen_heap():
  """The objects of the tests before this one moved out of the collector's sight
  (gc.freeze) while it runs: a failed read ends in a full gc.collect(), which in a
  process that has run a thousand tests scans millions of objects (seconds each)."""
  gc.freeze()
  yield
  gc.unfreeze()


# A failed read's leftover coroutines print hundreds of lines when freed: not any more.
@pytest.mark.usefixtures("frozen_heap")
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupt_latest_checkpoint_is_reported_and_the_previous_used(two_checkpoints,
                                                                       tmp_path, kind):
  workdir = tmp_path / "run"
  shutil.copytree(two_checkpoints, workdir)
  corrupt(kind, str(workdir / "checkpoints" / "4"))
  lines = []
  checkpointer = Checkpointer(str(workdir))
  step, state, meta = checkpointer.restore_intact(STATE, lines.append)
  assert (step, meta) == (2, {"step": 2})
  np.testing.assert_array_equal(state["a"], np.arange(1000.0) + 2)
  assert len(lines) == 1 and "\n" not in lines[0]
  assert f"checkpoint {workdir / 'checkpoints' / '4'} does not restore" in lines[0]
  assert "resuming from step 2" in lines[0]
  # Out of the way: the resumed run saves step 4 again.
  assert checkpointer.manager.all_steps() == [2]
  assert (workdir / "corrupt_checkpoints" / "4").is_dir()
  checkpointer.save(4, STATE, {"step": 4})
  assert checkpointer.latest_step() == 4
  checkpointer.close()


@pytest.mark.usefixtures("frozen_heap")
def test_a_checkpoint_another_process_cannot_read_is_unreadable_for_all(two_checkpoints,
                                                                        tmp_path,
                                                                        monkeypatch):
  """In a job of several processes all resume from one step: step 4 restores here but not
  on another process (a shard one host cannot read), so every process takes step 2."""
  from rlhf_jax.training import checkpoint as checkpoint_lib
  workdir = tmp_path / "run"
  shutil.copytree(two_checkpoints, workdir)
  views = iter([False, True])  # the job's verdict on step 4, then on step 2
  monkeypatch.setattr(checkpoint_lib.parallel, "all_processes",
                      lambda flag: flag and next(views))
  lines = []
  checkpointer = Checkpointer(str(workdir))
  step, _, meta = checkpointer.restore_intact(STATE, lines.append)
  assert (step, meta) == (2, {"step": 2})
  assert "unreadable on another process of the job" in lines[0]
  checkpointer.close()


@pytest.mark.usefixtures("frozen_heap")
def test_a_read_that_fails_once_moves_nothing(two_checkpoints, tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  shutil.copytree(two_checkpoints, workdir)
  checkpointer = Checkpointer(str(workdir))
  restore, failures = checkpointer.restore, [OSError("a passing I/O error")]

  def flaky(step, template):
    if failures:
      raise failures.pop()
    return restore(step, template)

  monkeypatch.setattr(checkpointer, "restore", flaky)
  lines = []
  step, _, _ = checkpointer.restore_intact(STATE, lines.append)
  assert step == 4 and not lines and not (workdir / "corrupt_checkpoints").exists()
  checkpointer.close()


@pytest.mark.usefixtures("frozen_heap")
def test_no_checkpoint_that_restores_is_one_error_and_moves_nothing(two_checkpoints,
                                                                     tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(two_checkpoints, workdir)
  wrong = {"a": jnp.zeros(7), "b": {"c": jnp.ones((3, 4))}}  # a changed config's shapes
  checkpointer = Checkpointer(str(workdir))
  with pytest.raises(ConfigError, match=rf"^{workdir / 'checkpoints' / '4'}: no checkpoint"):
    checkpointer.restore_intact(wrong, print)
  assert checkpointer.manager.all_steps() == [2, 4]
  assert not (workdir / "corrupt_checkpoints").exists()
  checkpointer.close()


# ------------------------------------------------------------------ end to end


def config(steps: int = 4):
  c = shrink(preset("grpo"))
  c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 2, 1
  c.train.eval_samples, c.train.log_rollouts = 0, 2
  return c


def timeless(directory):
  """The records without wall-clock figures and the fleet's counters."""
  return [{k: v for k, v in r.items()
           if k not in TIMING and not k.startswith(("time_", "fleet/"))}
          for r in records(directory)]


def checkpoint_steps(directory):
  return sorted(int(name) for name in os.listdir(directory / "checkpoints") if name.isdigit())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """An uninterrupted run: its records and final state are what every resume must give."""
  directory = tmp_path_factory.mktemp("straight")
  trainer = make_trainer(config(), directory)
  trainer.run()
  return directory, trainer


def split_run(straight, tmp_path, name):
  directory = tmp_path / name
  shutil.copytree(straight[0] / "sft", directory / "sft")
  return directory


def resume_and_compare(straight, directory, lines, expected_step):
  resumed = loop.Trainer(config(), str(directory), log=lines.append, scorer=scorer(config()))
  assert resumed.step == expected_step
  resumed.run()
  assert timeless(directory) == timeless(straight[0])
  assert [json.loads(l)["step"] for l in open(directory / "rollouts.jsonl")] == [
      json.loads(l)["step"] for l in open(straight[0] / "rollouts.jsonl")]
  jax.tree.map(np.testing.assert_array_equal, resumed.learner.state(),
               straight[1].learner.state())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["truncated_array", "empty_step_directory"])
def test_a_corrupt_last_checkpoint_and_torn_records_resume_exactly(straight, tmp_path, kind):
  directory = tmp_path / "run"
  shutil.copytree(straight[0], directory)  # its trainer.lock names a process long gone
  corrupt(kind, str(directory / "checkpoints" / "4"))
  for name in ("metrics.jsonl", "rollouts.jsonl"):  # killed while writing step 4's lines
    text = (directory / name).read_text()
    (directory / name).write_text(text[:-7])
  lines = []
  resume_and_compare(straight, directory, lines, expected_step=2)
  warnings = [line for line in lines if line.startswith("warning:")]
  assert len(warnings) == 3, lines
  assert f"checkpoint {directory / 'checkpoints' / '4'} does not restore" in warnings[0]
  assert any(f"{directory / 'metrics.jsonl'}: dropped its torn last line" in w
             for w in warnings)
  assert any(f"{directory / 'rollouts.jsonl'}: dropped its torn last line" in w
             for w in warnings)


class SignalledInEvaluation(loop.Trainer):
  """Sends itself a signal (or raises KeyboardInterrupt) in step 3's held-out evaluation."""
  how = "SIGINT"
  sent_at = None

  def evaluate(self):
    if self.step == 3:
      if self.how == "raise":
        raise KeyboardInterrupt
      SignalledInEvaluation.sent_at = time.perf_counter()
      os.kill(os.getpid(), getattr(signal, self.how))
    return super().evaluate()


@pytest.mark.slow
def test_sigint_during_evaluation_finishes_the_step_saves_and_resumes_exactly(straight,
                                                                             tmp_path):
  directory = split_run(straight, tmp_path, "sigint")
  lines = []
  trainer = SignalledInEvaluation(config(), str(directory), log=lines.append,
                                  scorer=scorer(config()))
  with pytest.raises(run_control.Stopped) as stopped:
    trainer.run()
  seconds = time.perf_counter() - SignalledInEvaluation.sent_at
  assert stopped.value.code == 130
  assert [r["step"] for r in records(directory)] == [0, 1, 2, 3]
  assert "eval_accuracy" in records(directory)[-1]  # the interrupted evaluation finished
  assert checkpoint_steps(directory) == [2, 3]
  assert lines[-1] == (f"stopped by SIGINT after step 3: checkpoint at step 3 in "
                       f"{directory / 'checkpoints' / '3'}; resume with the same command")
  print(f"SIGINT in evaluation to Stopped: {seconds:.2f} s")
  resume_and_compare(straight, directory, [], expected_step=3)


@pytest.mark.slow
def test_an_interrupt_inside_evaluation_saves_no_step_without_its_records(straight,
                                                                          tmp_path):
  directory = split_run(straight, tmp_path, "interrupt")
  lines = []
  trainer = SignalledInEvaluation(config(), str(directory), log=lines.append,
                                  scorer=scorer(config()))
  trainer.how = "raise"
  with pytest.raises(KeyboardInterrupt):
    trainer.run()
  assert lines[-1] == ("interrupted at once during step 3: nothing saved; resume continues "
                       f"from checkpoint at step 2 in {directory / 'checkpoints' / '2'}")
  steps = [r["step"] for r in records(directory)]
  assert steps == [0, 1, 2] and checkpoint_steps(directory) == [2]
  assert set(checkpoint_steps(directory)) <= set(steps)


@pytest.mark.slow
def test_losing_every_server_saves_the_last_step_and_resumes_exactly(straight, tmp_path,
                                                                      monkeypatch):
  fleet_lib = pytest.importorskip("rlhf_jax.sampling.remote.fleet")

  class FleetThatDies(fleet_lib.SamplerFleet):
    """The in-process sampler behind the fleet's type; every server is gone once step 3's
    records are written (in step 4's rollout)."""

    def __init__(self, scheduler):  # pylint: disable=super-init-not-called
      self.scheduler = scheduler

    def generate(self, prompts, sampling):
      written = directory / "metrics.jsonl"
      if written.exists() and 3 in [r["step"] for r in records(directory)]:
        raise fleet_lib.FleetUnavailableError("every sampler server is gone: a:1, b:2")
      return self.scheduler.generate(prompts, sampling)

    def update_params(self, params, version, rollback=False):
      del rollback  # the in-process scheduler takes any version
      return self.scheduler.update_params(params, version)

    def metrics(self):
      return {"fleet/live_servers": 2.0, "fleet/server_deaths": 0.0}

    def close(self):
      self.scheduler.close()

  real = build.build_sampler
  monkeypatch.setattr(build, "build_sampler", lambda *a: FleetThatDies(real(*a)))
  directory = split_run(straight, tmp_path, "fleet")
  lines = []
  trainer = loop.Trainer(config(), str(directory), log=lines.append, scorer=scorer(config()))
  with pytest.raises(run_control.Stopped) as stopped:
    trainer.run()
  assert stopped.value.code == 1
  assert [r["step"] for r in records(directory)] == [0, 1, 2, 3]
  assert all(r["fleet/live_servers"] == 2.0 for r in records(directory)[1:])
  assert checkpoint_steps(directory) == [2, 3]
  assert lines[-1] == ("every sampling server is gone (every sampler server is gone: a:1, "
                       f"b:2); checkpoint at step 3 in {directory / 'checkpoints' / '3'}; "
                       "resume with the same command once a server is back")

  def no_server(*args):
    raise fleet_lib.FleetUnavailableError("no sampler server answered in 60 s: a:1, b:2")

  # Resumed while the servers are still down: one line naming the field (and the lock
  # is given back, as the resume below shows).
  monkeypatch.setattr(build, "build_sampler", no_server)
  with pytest.raises(ConfigError, match=r"^config.sampler.addresses: no sampler server "
                     r"answered in 60 s: a:1, b:2$"):
    loop.Trainer(config(), str(directory), log=print, scorer=scorer(config()))
  monkeypatch.setattr(build, "build_sampler", real)
  resume_and_compare(straight, directory, [], expected_step=3)


def test_the_policy_is_written_before_the_workdir_lock_is_released(tmp_path, monkeypatch):
  """Another run may take the workdir once the lock is gone: `run` exports first."""
  events = []

  class Held:
    """What `run` closes; the lock says when it goes."""

    def close(self, **kwargs):
      del kwargs

    def release(self):
      events.append("lock released")

  monkeypatch.setattr(loop.models, "save_policy",
                      lambda path, *args: events.append(f"policy written to {path}"))
  trainer = object.__new__(loop.Trainer)
  held = Held()
  trainer.__dict__.update(
      config=config(), step=4, show_progress=False, workdir=str(tmp_path), rollout=held,
      checkpointer=held, metrics=held, lock=held, learner=types.SimpleNamespace(
          policy_params={"w": np.ones(2)}), policy=types.SimpleNamespace(
              model=None, tokenizer=None, prefix_tokens=()),
      train=lambda *args: None)
  assert trainer.run()["policy"] == str(tmp_path / "policy")
  assert events == [f"policy written to {tmp_path / 'policy'}", "lock released"]
