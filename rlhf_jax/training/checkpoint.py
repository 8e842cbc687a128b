"""Training checkpoints (Orbax): everything a run needs to continue exactly.

One checkpoint per saved step under <workdir>/checkpoints/<step>/ with two items:
  state   the array pytree: actor and critic params + optimizer states, the
          reference params (EMA or fixed);
  meta    JSON: step, the trainer's NumPy RNG state, the data position, the
          dynamic-sampling buffer, the config, and the sampler's weight version.
Saving is atomic (Orbax writes to a temporary directory and renames), so a run
killed mid-save resumes from the previous checkpoint. A checkpoint damaged afterwards
(a truncated or missing array file, garbage metadata, an emptied step directory, a
missing meta file) is reported in one line naming its directory, moved aside to
<workdir>/corrupt_checkpoints/, and the newest intact one is used (`restore_intact`).
A save that fails (a full disk) is one line naming the intact checkpoint, its temporary
directory removed (`Checkpointer.save`).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import gc
import json
import logging
import os
import shutil
import sys
from typing import Any, Callable, NoReturn

import jax
import orbax.checkpoint as ocp

from rlhf_jax import parallel
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import show


class Checkpointer:
  """Saves and restores trainer checkpoints in `<workdir>/checkpoints`.

  Args:
    workdir: the run directory.
    max_to_keep: most checkpoints kept (older ones are deleted).
  """

  def __init__(self, workdir: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                             create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Writes checkpoint `step` and waits until it is on disk. A save that fails (a full
    disk, a quota) leaves the checkpoints before it as they were: its temporary
    directory is removed and a CheckpointSaveError says which checkpoint is intact."""
    try:
      with quiet_orbax_errors():
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)),
                          force=True)
        self.manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      raise self._failed_save(step, error) from None

  def _failed_save(self, step: int, error: BaseException) -> "CheckpointSaveError":
    """Removes what the failed save of `step` left (Orbax's `<step>.orbax-checkpoint-tmp*`
    directory) and describes it, with the newest intact checkpoint."""
    partial = [os.path.join(self.directory, name) for name in os.listdir(self.directory)
               if name.startswith(f"{step}.orbax-checkpoint-tmp")]
    if parallel.is_main_process():  # a job's processes share the workdir: one removes it
      for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    self.manager.reload()
    text = str(error)
    reason = ("no space left on device" if "No space left on device" in text
              or getattr(error, "errno", None) == errno.ENOSPC else describe_error(error))
    latest = self.manager.latest_step()
    intact = (f"the newest intact checkpoint is {os.path.join(self.directory, str(latest))} "
              "(a resume continues from it)" if latest is not None
              else "there is no earlier checkpoint")
    removed = f"; its temporary directory {partial[0]} was removed" if partial else ""
    return CheckpointSaveError(f"checkpoint {os.path.join(self.directory, str(step))} was "
                               f"not saved ({reason}){removed}; {intact}")

  def restore(self, step: int, state_template: Any) -> tuple[Any, dict[str, Any]]:
    """(state, meta) of checkpoint `step`; arrays take the template's shapes,
    dtypes and shardings."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def restore_intact(self, state_template: Any, log: Callable[[str], None] = print
                     ) -> tuple[int, Any, dict[str, Any]] | None:
    """(step, state, meta) of the newest checkpoint that restores, or None when there is
    none. Newer ones that do not restore are reported in one line each and moved aside
    (`set_aside`) once an older one has restored; when none restores nothing is moved
    (a changed config fails them all alike) and the newest's error is a ConfigError."""
    failures = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      restored, error = self._try_restore(step, state_template)
      # Every process of a job resumes from one step: a checkpoint one of them could not
      # read is unreadable for all (else they would part ways, or wait on each other).
      if not parallel.all_processes(restored is not None):
        failures.append((step, error or "unreadable on another process of the job"))
        continue
      state, meta = restored
      for bad, error in failures:
        moved = self.set_aside(bad)
        log(f"warning: checkpoint {os.path.join(self.directory, str(bad))} does not restore "
            f"({error}); moved to {moved}; resuming from step {step}")
      return step, state, meta
    if not failures:
      return None
    step, error = failures[0]
    raise ConfigError(f"{os.path.join(self.directory, str(step))}: no checkpoint of the run "
                      f"restores (the newest: {error}); if the config "
                      "changed, resume with the saved one, else remove the checkpoints")

  def _try_restore(self, step: int, state_template: Any, attempts: int = 2):
    """((state, meta), None), or (None, the error in one line) when `step` does not
    restore in `attempts` tries (a second one, so a passing I/O error moves nothing)."""
    error = ""
    for _ in range(attempts):
      with quiet_failed_reads() as failed:
        try:
          return self.restore(step, state_template), None
        except Exception as failure:  # pylint: disable=broad-except
          error = describe_error(failure)
          failed.append(error)
    return None, error

  def set_aside(self, step: int) -> str:
    """Moves checkpoint `step` to <workdir>/corrupt_checkpoints/<step>[-n] (kept for a
    look, out of the manager's way: a resumed run saves that step again); its new path."""
    target = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints", str(step))
    base, n = target, 0
    while os.path.exists(target):
      n += 1
      target = f"{base}-{n}"
    if parallel.is_main_process():  # a job's processes share the workdir: one moves it
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), target)
    parallel.barrier(f"set aside checkpoint {step}")
    self.manager.reload()
    return target

  def close(self) -> None:
    """Finishes pending writes."""
    self.manager.wait_until_finished()
    self.manager.close()


# The fields that may change when a run resumes, without a word: how long it runs
# (train.steps), how it is evaluated, logged and checkpointed, and where its job and
# servers are; none changes what a step computes. Any other changed field is refused
# (`check_resumable`): a resumed run must be the run its checkpoints were made by.
# docs/training.md lists them; fnmatch patterns over the dotted field names.
RESUMABLE_FIELDS = (
    "train.steps",
    # evaluation
    "train.eval_every", "train.eval_samples", "data.eval_file", "data.num_eval",
    # logging and checkpoints
    "train.log_every", "train.log_rollouts", "train.loggers", "train.run_name",
    "train.wandb_project", "train.wandb_entity", "train.mlflow_experiment",
    "train.checkpoint_every",
    # when a run whose every reward fails stops (raised to resume past a stop)
    "reward.max_failed_steps",
    # where the job, its compile cache and its sampling servers are
    "compile_cache", "distributed.*", "sampler.address", "sampler.addresses",
    "sampler.tls_*", "sampler.token_file", "sampler.reconnect_s",
    "reward.judge_sampler.address", "reward.judge_sampler.addresses",
    "reward.judge_sampler.tls_*", "reward.judge_sampler.token_file",
    "reward.judge_sampler.reconnect_s",
)
_SHOWN_CHANGES = 8  # changed fields listed in the refusal


def resumable(field: str) -> bool:
  """Whether the dotted config `field` may change on resume (RESUMABLE_FIELDS)."""
  return any(fnmatch.fnmatchcase(field, pattern) for pattern in RESUMABLE_FIELDS)


def config_changes(saved: dict[str, Any], current: dict[str, Any]
                   ) -> tuple[list[tuple[str, Any, Any]], list[str]]:
  """(the fields, outside RESUMABLE_FIELDS, whose values differ between two configs'
  `to_dict()`s, as (field, saved value, current value); the fields in one config only, a
  library of another version's). Tuples and lists compare alike (a checkpoint keeps JSON)."""
  saved = _flat(json.loads(json.dumps(saved)))
  current = _flat(json.loads(json.dumps(current)))
  changed = [(field, saved[field], current[field]) for field in sorted(set(saved) & set(current))
             if saved[field] != current[field] and not resumable(field)]
  return changed, sorted(set(saved) ^ set(current))


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def saved_config(workdir: str) -> tuple[int, dict[str, Any]] | None:
  """(step, config) of the newest checkpoint in `<workdir>/checkpoints` whose metadata
  reads (its arrays are not read), or None without one."""
  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  if not os.path.isdir(directory):
    return None
  manager = ocp.CheckpointManager(directory, item_names=("state", "meta"))
  try:
    for step in sorted(manager.all_steps(), reverse=True):
      with quiet_failed_reads() as failed:
        try:
          meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as failure:  # pylint: disable=broad-except  # restore_intact reports it
          failed.append(describe_error(failure))
      if failed:
        continue
      if isinstance(meta.get("meta"), dict) and isinstance(meta["meta"].get("config"), dict):
        return step, meta["meta"]["config"]
  finally:
    manager.close()
  return None


def check_resumable(config, workdir: str) -> list[str]:
  """Refuses to resume the checkpoints of `workdir` with a config that differs from the
  one they were made with in a field outside RESUMABLE_FIELDS: a ConfigError listing the
  fields (saved → given) and the ways out. Returns the fields one of the two configs lacks
  (a library of another version added or removed them): taken at their given values."""
  found = saved_config(workdir)
  if found is None:
    return []
  step, saved = found
  changed, unmatched = config_changes(saved, config.to_dict())
  if changed:
    refuse_changes(workdir, step, changed)
  return unmatched


def refuse_changes(workdir: str, step: int, changed: list[tuple[str, Any, Any]]) -> NoReturn:
  """The ConfigError of a resume whose config changed `changed` (`config_changes`)."""
  shown = ", ".join(f"{field} {show(old)} → {show(new)}"
                    for field, old, new in changed[:_SHOWN_CHANGES])
  more = f" and {len(changed) - _SHOWN_CHANGES} more" if len(changed) > _SHOWN_CHANGES else ""
  raise ConfigError(
      f"--workdir={workdir}: its checkpoint (step {step}) was made with another config: "
      f"{shown}{more}; resume with the saved values, pass --overwrite to start over "
      "(overwrite=True from Python), or choose another workdir (train.steps, evaluation "
      "and logging fields may change on resume: docs/training.md)")


class CheckpointSaveError(ConfigError):
  """A checkpoint that could not be written (one line, which the launchers print as
  `error: ...` with exit status 2; the checkpoints before it are intact)."""


@contextlib.contextmanager
def quiet_orbax_errors():
  """Holds back the error records Orbax's save threads log (a traceback each, four per
  failed save) while the block runs; the failure itself is raised to the caller."""
  def keep(record) -> bool:
    return record.levelno < logging.ERROR or "orbax" not in record.pathname
  logger = logging.getLogger("absl")
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)


def describe_error(error: BaseException) -> str:
  """An exception as one short line: its type and the first line of its message."""
  lines = str(error).strip().splitlines()
  text = lines[0].split(" See full TensorStore details")[0] if lines else ""
  text = text if len(text) <= 160 else text[:157] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


@contextlib.contextmanager
def quiet_failed_reads():
  """Frees the reads a failed restore left unfinished without their tracebacks: Orbax
  gathers one coroutine per array, and those never awaited after the first failure
  print hundreds of lines (a TensorStore spec each) as "Exception ignored" when freed.
  Yields a list the block appends its error to when the read failed: only then is the
  heap collected (a read that succeeded left nothing, and a full collection in a large
  process takes seconds)."""
  hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  failed: list[str] = []
  try:
    yield failed
  finally:
    if failed:
      gc.collect()
    sys.unraisablehook = hook
