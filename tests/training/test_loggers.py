"""train.loggers: W&B (offline) and MLflow (a SQLite store in the workdir) get the config,
the metrics of each step and the rollout table, read back from what they wrote; a resumed
run continues the same run; bad names and missing packages fail validation in one line."""

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training import loggers as loggers_lib
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config
from rlhf_jax.training.metrics import MetricsWriter
from rlhf_jax.training.metrics import RolloutLog
from tests.training.rollout_logs import TOKENIZER
from tests.training.rollout_logs import rollouts
from tests.training.wandb_records import offline_env
from tests.training.wandb_records import read_runs

# The rows of rollout_logs' two samples: prompt "ab" + "c|d\nef", and "abc|d" + "e".
ROWS = [[1, 0.5, "ab", "c|d\nef"], [1, -1.0, "abc|d", "e"]]


def config_with(loggers: str):
  config = base_config("arith")
  config.train.loggers = loggers
  return config


def log_two_steps(workdir, config, first_step: int = 0, failed: bool = False) -> None:
  """What the Trainer does: an evaluation, then per step the samples and the metrics."""
  loggers = loggers_lib.build_loggers(config, str(workdir))
  writer = MetricsWriter(str(workdir), loggers)
  samples = RolloutLog(str(workdir), 2, TOKENIZER, loggers)
  writer.write({"step": first_step, "eval_accuracy": 0.25})
  samples.write(first_step + 1, rollouts())
  writer.write({"step": first_step + 1, "reward_mean": 0.5, "eval_pass@4": 0.75,
                "process/step_score_mean": -0.5, "note": "text is no metric"})
  writer.close(failed=failed)


def test_wandb_gets_the_config_metrics_and_rollout_table(tmp_path, monkeypatch):
  offline_env(monkeypatch, tmp_path)
  workdir = tmp_path / "run-7"
  workdir.mkdir()
  log_two_steps(workdir, config_with("wandb"))
  (run,) = read_runs(workdir)
  assert run["id"] == (workdir / "wandb_run_id").read_text().strip()
  assert (run["name"], run["project"], run["exit_code"]) == ("run-7", "rlhf_jax", 0)
  assert run["config"]["train.loggers"] == "wandb"
  assert run["config"]["data.levels"] == [1, 2] and run["config"]["train.steps"] == 60
  history = run["history"]
  assert history[0] == {"eval_accuracy": 0.25}
  assert history[1]["rollouts"]["_type"] == "table-file"
  assert {k: v for k, v in history[1].items() if k != "rollouts"} == {
      "reward_mean": 0.5, "eval_pass@4": 0.75, "process/step_score_mean": -0.5}
  (table,) = run["tables"].values()
  assert table["columns"] == ["step", "reward", "prompt", "response"]
  assert table["data"] == ROWS


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
  offline_env(monkeypatch, tmp_path)
  config = config_with("wandb")
  log_two_steps(tmp_path, config, failed=True)
  config.train.run_name = "second try"
  log_two_steps(tmp_path, config, first_step=1)
  first, second = read_runs(tmp_path)  # offline: one directory per session, one run id
  assert first["id"] == second["id"] == (tmp_path / "wandb_run_id").read_text().strip()
  assert (first["exit_code"], second["exit_code"]) == (1, 0)
  assert second["name"] == "second try" and sorted(second["history"]) == [1, 2]
  assert second["history"][2]["reward_mean"] == 0.5


def test_mlflow_gets_params_legal_metric_names_and_rollout_json(tmp_path, monkeypatch):
  from mlflow import MlflowClient
  from mlflow.artifacts import load_dict

  monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
  config = config_with("mlflow")
  config.data.curriculum = "x" * 7000  # longer than MLflow takes for a param
  log_two_steps(tmp_path, config, failed=True)
  client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
  run_id = (tmp_path / "mlflow_run_id").read_text().strip()
  run = client.get_run(run_id)
  assert (run.info.run_name, run.info.status) == (tmp_path.name, "FAILED")
  params = run.data.params
  assert params["train.loggers"] == "mlflow" and params["data.levels"] == "[1, 2]"
  assert params["data.curriculum"] == "x" * 6000
  history = lambda name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)]
  assert history("eval_accuracy") == [(0, 0.25)]
  assert history("eval_pass_4") == [(1, 0.75)]  # "@" is not allowed in MLflow's names
  assert history("process/step_score_mean") == [(1, -0.5)]
  assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
  table = load_dict(f"{run.info.artifact_uri}/rollouts/step_000001.json")
  assert table == {"columns": ["step", "reward", "prompt", "response"], "data": ROWS}
  config.train.steps = 99  # a changed field: MLflow keeps the param as first logged
  log_two_steps(tmp_path, config, first_step=1)
  run = client.get_run(run_id)
  assert run.info.status == "FINISHED" and run.data.params["train.steps"] == "60"
  assert history("reward_mean") == [(1, 0.5), (2, 0.5)]


def test_no_loggers_and_other_processes_log_nothing_but_metrics_jsonl(tmp_path):
  assert loggers_lib.build_loggers(config_with("wandb,mlflow"), str(tmp_path),
                                   enabled=False) == []
  assert loggers_lib.build_loggers(config_with(""), str(tmp_path)) == []
  assert loggers_lib.parse_loggers(" wandb, tensorboard,,wandb ") == ("wandb", "tensorboard")
  validate_config(config_with(""))


def test_an_unknown_logger_is_a_one_line_config_error():
  with pytest.raises(ConfigError) as error:
    validate_config(config_with("tensorboard,neptune"))
  assert str(error.value) == (
      "config.train.loggers: invalid value 'tensorboard,neptune': unknown logger 'neptune': "
      "must be a comma-separated list of tensorboard, wandb, mlflow (empty: metrics.jsonl "
      "only)")


@pytest.mark.parametrize("loggers, module, extra", [("tensorboard,wandb", "wandb", "wandb"),
                                                    ("mlflow", "sqlalchemy", "mlflow"),
                                                    ("tensorboard", "tensorboardX",
                                                     "tensorboard")])
def test_a_missing_package_names_the_extra_to_install(monkeypatch, loggers, module, extra):
  real = loggers_lib.importlib.util.find_spec
  monkeypatch.setattr(loggers_lib.importlib.util, "find_spec",
                      lambda name, *a: None if name == module else real(name, *a))
  with pytest.raises(ConfigError) as error:
    validate_config(config_with(loggers))
  assert str(error.value) == (
      f"config.train.loggers: invalid value {loggers!r}: the {extra} logger needs the package "
      f"{module}: pip install 'rlhf-jax[{extra}]' (or leave it out; metrics.jsonl is always "
      "written)")


class Recorder:
  """A logger that remembers how its run ended."""

  ended = None

  def log_metrics(self, step, metrics):
    pass

  def log_rollouts(self, step, rows):
    pass

  def close(self, failed=False):
    self.ended = "failed" if failed else "finished"


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_crash_in_training_ends_the_loggers_runs_as_failed(tmp_path, error):
  from types import SimpleNamespace

  from rlhf_jax.training.loop import Trainer

  trainer = object.__new__(Trainer)  # the loop alone, around a step that raises
  recorder = Recorder()
  trainer.config, trainer.held_out, trainer.step = base_config("arith"), [], 0
  trainer.show_progress, trainer.log, trainer.save = False, print, lambda: None
  trainer.metrics = MetricsWriter(str(tmp_path), [recorder])
  trainer.rollout = trainer.checkpointer = SimpleNamespace(close=lambda: None,
                                                           latest_step=lambda: None)
  trainer.lock = SimpleNamespace(release=lambda: None)
  trainer.fleet, trainer.recorded_step = None, 0
  trainer.train_step = lambda: (_ for _ in ()).throw(error("step failed"))
  with pytest.raises(error):
    trainer.run()
  assert recorder.ended == "failed"
