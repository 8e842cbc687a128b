"""A workdir's checkpoints resume only with the config they were made with, but for the
fields that may change on resume (training/checkpoint.RESUMABLE_FIELDS): anything else
is refused in one line listing the fields, before any work; `overwrite` starts over.
A finished run re-run with another learning rate or model shape used to print "done" and
ignore them (or continue with the saved architecture)."""

from __future__ import annotations

import os

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import checkpoint
from rlhf_jax.training import run_control
from rlhf_jax.training import stages
from tests.training.runs import preset
from tests.training.runs import records
from tests.training.runs import shrink


def config():
  c = shrink(preset("grpo"))
  c.train.eval_every = 0  # evaluation off: the run writes no held-out figures
  return c


def test_config_changes_ignore_the_resumable_fields_and_json_tuples():
  saved = {"train": {"steps": 2, "log_every": 1, "minibatches": 2},
           "sampler": {"prompt_buckets": [64], "addresses": ["a:1"]},
           "model": {"hidden_size": 32}, "old_field": 1}
  current = {"train": {"steps": 9, "log_every": 5, "minibatches": 4},
             "sampler": {"prompt_buckets": (64,), "addresses": ("b:2",)},
             "model": {"hidden_size": 64}, "new_field": 2}
  changed, unmatched = checkpoint.config_changes(saved, current)
  assert changed == [("model.hidden_size", 32, 64), ("train.minibatches", 2, 4)]
  assert unmatched == ["new_field", "old_field"]
  for field in ("train.steps", "train.eval_every", "train.loggers", "train.log_rollouts",
                "distributed.process_id", "sampler.tls_ca"):
    assert checkpoint.resumable(field), field
  for field in ("optimizer.learning_rate", "model.num_layers", "rollout.group_size",
                "train.deterministic", "seed"):
    assert not checkpoint.resumable(field), field


def test_a_checkpoint_saved_with_the_retired_variant_field_resumes():
  # An older library saved `variant` (now the preset's overlay): a field this config
  # lacks is reported and taken as given, not refused.
  current = config().to_dict()
  saved = dict(current, variant="arith")
  assert "variant" not in current
  assert checkpoint.config_changes(saved, current) == ([], ["variant"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A 2-step run through `stages.run` (what launch/train.py runs), evaluation off."""
  workdir = tmp_path_factory.mktemp("finished")
  lines = []
  summary = stages.run(config(), str(workdir), progress=False, log=lines.append)
  assert summary["steps"] == 2
  return workdir


def listing(workdir):
  return sorted((str(p.relative_to(workdir)), p.stat().st_mtime_ns)
                for p in workdir.rglob("*") if p.name != "trainer.lock")


@pytest.mark.slow
def test_eval_every_0_runs_no_evaluation(finished):
  assert [r["step"] for r in records(finished)] == [1, 2]
  assert not any(k.startswith("eval") for r in records(finished) for k in r)


@pytest.mark.slow
def test_another_config_is_refused_listing_the_fields_before_any_work(finished):
  before = listing(finished)
  changed = config()
  changed.optimizer.learning_rate = 1e-3
  changed.model.hidden_size, changed.model.num_layers = 64, 2  # another model shape
  for validate_only in (True, False):
    with pytest.raises(ConfigError) as error:
      stages.run(changed, str(finished), progress=False, log=lambda line: None,
                 validate_only=validate_only)
    message = str(error.value)
    assert message.startswith(
        f"--workdir={finished}: its checkpoint (step 2) was made with another config: "
        "model.hidden_size 32 → 64, model.num_layers 1 → 2, optimizer.learning_rate "
        f"{config().optimizer.learning_rate!r} → 0.001; "), message
    assert "--overwrite" in message and "\n" not in message
  assert listing(finished) == before  # nothing written, nothing loaded


@pytest.mark.slow
def test_steps_evaluation_and_logging_fields_resume_without_a_word(finished):
  same = config()
  same.train.steps, same.train.eval_every, same.train.log_every = 5, 3, 2
  same.train.loggers, same.train.log_rollouts, same.data.num_eval = "", 4, 16
  lines = []
  assert stages.run(same, str(finished), progress=False, log=lines.append,
                    validate_only=True) is None
  assert lines == ["config ok"]


@pytest.mark.slow
def test_overwrite_removes_what_the_run_wrote_once_the_lock_is_held(finished, tmp_path,
                                                                    monkeypatch):
  workdir = tmp_path / "copy"
  os.system(f"cp -r {finished} {workdir}")
  (workdir / "notes.txt").write_text("the user's own file stays\n")
  changed = config()
  changed.optimizer.learning_rate = 1e-3

  class Prepared(Exception):
    pass

  def prepare_run(c, directory, log):
    raise Prepared(sorted(os.listdir(directory)))  # what is left when the run would start

  monkeypatch.setattr(stages, "prepare_run", prepare_run)
  lines = []
  with pytest.raises(Prepared) as left:
    stages.run(changed, str(workdir), progress=False, log=lines.append, overwrite=True)
  assert left.value.args[0] == ["notes.txt", run_control.LOCK_FILE]
  assert lines[-1].startswith("--overwrite: removed checkpoints, metrics.jsonl, policy, "
                              "tensorboard, sft from ")
  held = run_control.WorkdirLock(str(tmp_path / "other"))
  with pytest.raises(RuntimeError, match="lock held"):
    run_control.start_over(str(workdir), held)
