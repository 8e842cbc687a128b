"""Where a run's metrics go besides <workdir>/metrics.jsonl (always written): the progress
display (`progress_bar`: a tqdm bar on a terminal, plain lines in a log file) and the loggers
named in `train.loggers`, a comma-separated list of tensorboard, wandb and mlflow.

Each logger is a small class behind one interface, built in one place (`build_loggers`):

    __init__(workdir, config)   starts its run and records the config (flattened)
    log_metrics(step, metrics)  a step's numbers (name → float)
    log_rollouts(step, rows)    the step's samples of `train.log_rollouts`: dicts of
                                step, reward, prompt and response (text)
    close(failed)               flushes and finishes its run (`failed`: the run raised)

A resumed run continues the same W&B and MLflow runs: their ids are kept in the workdir
(wandb_run_id, mlflow_run_id).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import re
import sys
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import ml_collections

from rlhf_jax.config_errors import invalid
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section

# name → (the modules it imports, the pip extra that installs them)
LOGGERS = {"tensorboard": (("tensorboardX",), "tensorboard"),
           "wandb": (("wandb",), "wandb"),
           # mlflow-skinny's client with the SQL store of the default <workdir>/mlflow.db
           "mlflow": (("mlflow", "sqlalchemy", "alembic"), "mlflow")}
ROLLOUT_COLUMNS = ("step", "reward", "prompt", "response")
PARAM_MAX_CHARS = 6000  # MLflow refuses longer param values


def on_terminal() -> bool:
  """Whether stdout and stderr are both terminals, where a progress bar can redraw itself;
  in a log file or a pipe its carriage returns make one unreadable line."""
  return all(stream is not None and hasattr(stream, "isatty") and stream.isatty()
             for stream in (sys.stdout, sys.stderr))


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[int, float], None]]:
  """A `progress(step, loss)` callback, closed on exit: a tqdm bar on a terminal; else
  (`on_terminal` False) one plain line per step on stdout, "<description> step 3/100:
  loss 0.1234" (`step` counts from 0, as optim/fit.py calls it)."""
  if not on_terminal():
    def plain(step: int, loss: float) -> None:
      print(f"{description} step {step + 1}/{total}: loss {loss:.4f}", flush=True)

    yield plain
    return
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  bar = tqdm(total=total, desc=description, unit="step", dynamic_ncols=True)

  def progress(step: int, loss: float) -> None:
    del step  # the bar counts
    bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.update(1)

  try:
    yield progress
  finally:
    bar.close()


def logger_fields() -> ml_collections.ConfigDict:
  """The loggers' fields, beside the `train` section's own."""
  train = ml_collections.ConfigDict()
  # Where metrics go besides metrics.jsonl (always written): a comma-separated list of
  # tensorboard (<workdir>/tensorboard), wandb, mlflow; empty: metrics.jsonl only. Each
  # needs its extra, e.g. pip install 'rlhf-jax[wandb]'.
  train.loggers = "tensorboard"
  train.run_name = ""  # The W&B / MLflow run's name ('': the workdir's basename).
  train.wandb_project = "rlhf_jax"  # W&B project.
  train.wandb_entity = ""  # W&B team or user ('': your default entity).
  # MLflow experiment; the tracking server is MLFLOW_TRACKING_URI, else the SQLite file
  # <workdir>/mlflow.db with artifacts in <workdir>/mlartifacts.
  train.mlflow_experiment = "rlhf_jax"
  return train


def check_logger_fields(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The loggers' fields of the trainer's `train` section."""
  del checking
  validate_loggers(c.train)


SECTION = Section("loggers", at="train", fields=logger_fields, check=check_logger_fields,
                  after=("train",))


def parse_loggers(text: str) -> tuple[str, ...]:
  """The logger names of `train.loggers`, in order, without repeats."""
  names = [name.strip() for name in str(text).split(",") if name.strip()]
  return tuple(dict.fromkeys(names))


def validate_loggers(train) -> None:
  """`train.loggers` names known loggers whose packages are installed; their fields."""
  for name in parse_loggers(train.loggers):
    if name not in LOGGERS:
      invalid("train.loggers", train.loggers, f"unknown logger {name!r}: must be a "
              f"comma-separated list of {', '.join(LOGGERS)} (empty: metrics.jsonl only)")
    modules, extra = LOGGERS[name]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
      invalid("train.loggers", train.loggers, f"the {name} logger needs the package "
              f"{', '.join(missing)}: pip install 'rlhf-jax[{extra}]' (or leave it out; "
              "metrics.jsonl is always written)")
  for field in ("wandb_project", "mlflow_experiment"):
    if not train[field]:
      invalid(f"train.{field}", train[field], "must not be empty")


class Logger(Protocol):
  """One destination of metrics (see the module's docstring)."""

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    """Records one step's numeric metrics (name → value)."""
    ...

  def log_rollouts(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """Records one step's sample rows (`train.log_rollouts`: step, reward, prompt and
    response text)."""
    ...

  def close(self, failed: bool = False) -> None:
    """Ends the run, marked failed when training raised."""
    ...


def build_loggers(config, workdir: str, *, enabled: bool = True) -> list[Logger]:
  """The loggers of `config.train.loggers` (none with `enabled` False: every process of
  a job but the first)."""
  if not enabled:
    return []
  classes = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MlflowLogger}
  loggers = []
  try:
    for name in parse_loggers(config.train.loggers):
      loggers.append(classes[name](workdir, config))
  except BaseException:  # e.g. W&B without a login: the runs already started end
    for logger in loggers:
      logger.close(failed=True)
    raise
  return loggers


def flatten_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A nested config dict (`ConfigDict.to_dict()`) as dotted name → value; tuples as lists."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten_config(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
  return out


def run_name(config, workdir: str) -> str:
  """`train.run_name`, or the workdir's basename."""
  return config.train.run_name or os.path.basename(os.path.abspath(workdir))


def stored_id(path: str, new) -> str:
  """The id kept in file `path`, or `new()` written there first (a resumed run's loggers
  continue the same run)."""
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read().strip()
  run_id = new()
  with open(path, "w", encoding="utf-8") as f:
    f.write(run_id + "\n")
  return run_id


class TensorBoardLogger:
  """Scalars as TensorBoard events in <workdir>/tensorboard (no samples)."""

  def __init__(self, workdir: str, config):
    del config  # TensorBoard gets the numbers only
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    for key, value in metrics.items():
      self.writer.add_scalar(key, value, global_step=step)
    self.writer.flush()

  def log_rollouts(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    pass

  def close(self, failed: bool = False) -> None:
    self.writer.close()


class WandbLogger:
  """A Weights & Biases run: the flattened config, metrics per step, samples as a
  `wandb.Table` per step ("rollouts"). Its id is kept in <workdir>/wandb_run_id, so a
  resumed run continues it; W&B ignores steps at or before its last one (a resumed run
  logs those again, with the same values on an exact resume)."""

  def __init__(self, workdir: str, config):
    import wandb  # pylint: disable=import-outside-toplevel
    self.wandb = wandb
    run_id = stored_id(os.path.join(workdir, "wandb_run_id"), lambda: uuid.uuid4().hex[:16])
    self.run = wandb.init(project=config.train.wandb_project,
                          entity=config.train.wandb_entity or None,
                          name=run_name(config, workdir), dir=workdir,
                          config=flatten_config(config.to_dict()), resume="allow", id=run_id)

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    self.run.log(dict(metrics), step=step)

  def log_rollouts(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    table = self.wandb.Table(columns=list(ROLLOUT_COLUMNS),
                             data=[[row[c] for c in ROLLOUT_COLUMNS] for row in rows])
    self.run.log({"rollouts": table}, step=step)

  def close(self, failed: bool = False) -> None:
    self.run.finish(exit_code=1 if failed else 0)


def mlflow_name(key: str) -> str:
  """`key` as a legal MLflow metric name: characters other than letters, digits, _ - . /
  and space become "_" (e.g. eval_pass@4 → eval_pass_4)."""
  return re.sub(r"[^\w\-./ ]", "_", key)


class MlflowLogger:
  """An MLflow run: the flattened config as params (values cut to 6000 characters),
  metrics per step under legal names (`mlflow_name`), samples as a JSON artifact per step
  (rollouts/step_<step>.json: columns and data). Its id is kept in <workdir>/mlflow_run_id,
  so a resumed run continues it."""

  def __init__(self, workdir: str, config):
    # pylint: disable=import-outside-toplevel
    from mlflow import MlflowClient
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException
    workdir = os.path.abspath(workdir)
    server = os.environ.get("MLFLOW_TRACKING_URI")
    self.client = client = MlflowClient(tracking_uri=server or f"sqlite:///{workdir}/mlflow.db")
    name = config.train.mlflow_experiment
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        name, artifact_location=None if server else
        pathlib.Path(workdir, "mlartifacts").as_uri())
    new = lambda: client.create_run(experiment_id, run_name=run_name(config, workdir)).info.run_id
    path = os.path.join(workdir, "mlflow_run_id")
    self.run_id = stored_id(path, new)
    try:
      logged = client.get_run(self.run_id).data.params
    except MlflowException:  # an id from another tracking server: a new run there
      os.remove(path)
      self.run_id, logged = stored_id(path, new), {}
    client.update_run(self.run_id, status="RUNNING")
    # MLflow refuses to change a logged param: a resumed run logs only new fields.
    params = {k: str(v)[:PARAM_MAX_CHARS] for k, v in flatten_config(config.to_dict()).items()}
    client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()
                                          if k not in logged])

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    from mlflow.entities import Metric  # pylint: disable=import-outside-toplevel
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), float(v), now, step)
                                                for k, v in metrics.items()])

  def log_rollouts(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    table = {"columns": list(ROLLOUT_COLUMNS),
             "data": [[row[c] for c in ROLLOUT_COLUMNS] for row in rows]}
    self.client.log_dict(self.run_id, table, f"rollouts/step_{step:06d}.json")

  def close(self, failed: bool = False) -> None:
    self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
