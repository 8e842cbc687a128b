"""A run from start to end (`run`, the one entry point of launch/train.py and notebooks),
and the stages that run before the RL loop when their output is missing: the arith SFT
warm start (<workdir>/sft) and the verifier-labelled offline data of DPO / DQO
(<workdir>/offline.jsonl). Each stage writes aside and renames, so an interrupted stage
never leaves something that looks finished.

`label_samples` samples `data.offline_samples` responses to each of the first
`data.offline_prompts` training prompts with the starting policy at the rollout
temperature and scores them with the run's verifier; launch/label_samples.py writes
them, and for a built-in task's run (`data.task`) train.py writes
<workdir>/offline.jsonl first when `data.offline_file` is empty.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

import jax

from rlhf_jax import cli
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms.sft import run_sft
from rlhf_jax.algorithms.sft import supervised_batches
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import unfit
from rlhf_jax.data.conversations import check_characters
from rlhf_jax.data.conversations import check_row
from rlhf_jax.data.conversations import record_texts
from rlhf_jax.data.conversations import supervised_row
from rlhf_jax.data.sources import read_records
from rlhf_jax.data import LabelledGroup
from rlhf_jax.data import write_labelled
from rlhf_jax.models.config import scratch_decoder
from rlhf_jax.models.hf import checks as checkpoint_checks
from rlhf_jax.rewards import Scorer
from rlhf_jax.rewards import build as reward_build
from rlhf_jax.rollout import GroupGenerator
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.rollout import modes as rollout_modes
from rlhf_jax.rollout.evaluation import evaluate_policy
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import registry as task_registry
from rlhf_jax.training import build
from rlhf_jax.training import inputs
from rlhf_jax.training import checkpoint as checkpoint_lib
from rlhf_jax.training import loggers as loggers_lib
from rlhf_jax.training import run_control
from rlhf_jax.training.config import validate_config
from rlhf_jax.training.loop import Trainer
from rlhf_jax.training.sections import fit_sampler_sizes
from rlhf_jax.training.sections import validate_mesh


def run(config, workdir: str, *, validate_only: bool = False, progress: bool = True,
        log: Callable[[str], None] | None = None, scorer: Scorer | None = None,
        overwrite: bool = False) -> dict[str, Any] | None:
  """Trains `config` (a trainer config: training/config.py) in `workdir`; what
  launch/train.py runs, callable from a notebook.

  In order: the whole config is validated once, before anything joins, loads or compiles;
  the workdir is checked; the process joins the job of `config.distributed` (one process:
  nothing to join) and the mesh is checked against the job's devices; the data files are
  read (every row); the workdir's checkpoints, if any, were made with this config but for
  the fields that may change on resume (`checkpoint.check_resumable`). `validate_only`
  stops there ("config ok"). Then the main process takes the workdir's lock (with
  `overwrite`, removes what a run wrote there: `run_control.start_over`) and runs the
  stages the run needs (`prepare_run`: the arith warm start, DPO / DQO offline data),
  every process waits for it, and the loop trains. Returns the summary (JSON-able figures;
  its last line is also logged as JSON on the main process), or None with `validate_only`.
  `log` (default: print) is called on the main process only.
  `scorer`: the reward in Python (default: the config's `reward` section); the data check
  asks it which tasks it scores.
  Raises ConfigError (one line naming the field) for anything the user can fix.
  `train.deterministic` sets XLA's deterministic GPU ops: it takes effect only when JAX has
  not computed anything yet in this process (in a notebook: call `run` first).
  """
  if config.train.deterministic:
    cli.enable_deterministic_gpu_ops()  # before JAX initialises its backends
  validate_config(config)
  run_control.check_workdir(workdir)
  parallel.initialize(config.distributed)
  validate_mesh(config, jax.device_count(),
                rows=config.rollout.prompts_per_step * config.rollout.group_size)
  inputs.check_data(config, workdir, scorer=scorer)  # the data files, every row, first
  main_process = parallel.is_main_process()
  emit = (log or (lambda line: print(line, flush=True))) if main_process else (lambda _: None)
  if not overwrite:  # the workdir's checkpoints were made with this config (but for
    # checkpoint.RESUMABLE_FIELDS), else one line listing the fields: on every process
    unmatched = checkpoint_lib.check_resumable(config, workdir)
    if unmatched:
      emit(f"resuming: fields the checkpoint's config lacks or has beyond this one (another "
           f"version of the library): {', '.join(unmatched)}; taken as given")
  if validate_only:
    emit("config ok")
    return None
  to_label = rollout_modes.rollout_mode(config).fixed_data and not config.data.offline_file
  if jax.process_count() > 1 and to_label:
    unfit("data.offline_file", "must be given in a job of several processes (label the "
          "samples first with launch/label_samples.py)")
  lock = run_control.WorkdirLock(workdir)
  if main_process:  # warm start, DPO / DQO offline data: once, in the shared workdir
    lock.acquire()  # before the warm start: a second launch must not train it as well
    if overwrite:  # what the run wrote goes, once no trainer can be writing it
      run_control.start_over(workdir, lock, also=_warm_start_outputs(config),
                             inputs=_config_paths(config), log=emit)
    prepare_run(config, workdir, log=emit)
  parallel.barrier("prepared")
  trainer = Trainer(config, workdir, log=emit, progress=progress, lock=lock, scorer=scorer)
  summary = trainer.run()
  if "eval_accuracy_start" in summary and "eval_accuracy_end" in summary:
    before, after = summary["eval_accuracy_start"], summary["eval_accuracy_end"]
    emit(f"held-out accuracy ({len(trainer.held_out)} problems, greedy): {100 * before:.1f}% "
         f"→ {100 * after:.1f}% ({100 * (after - before):+.1f} points) in "
         f"{summary['seconds']:.0f} s of RL; policy in {summary['policy']}")
  emit(json.dumps({"event": "done", **summary}))
  return summary


def _config_paths(c) -> dict[str, str]:
  """Every config field whose value is a path that exists (a checkpoint, a data file):
  what `--overwrite` must not remove."""
  flat = loggers_lib.flatten_config(c.to_dict())
  return {field: value for field, value in flat.items()
          if isinstance(value, str) and value and os.path.exists(value)}


def _warm_start_outputs(c) -> tuple[str, ...]:
  """What train.py writes in the workdir before the loop, for `--overwrite` to remove: for
  a built-in task's run (`data.task`), its warm start (<workdir>/sft, unless
  `model.checkpoint` names one) and the labelled samples of DPO / DQO
  (<workdir>/offline.jsonl, unless `data.offline_file` is given). The sft/ of a run on
  one's own data is launch/sft.py's: it stays."""
  if task_registry.builtin_run(c.data.task) is None:
    return ()
  return ((() if c.model.checkpoint else ("sft",))
          + (() if c.data.offline_file else ("offline.jsonl",)))


def warm_start(config, workdir: str, *, overwrite: bool = False,
               log: Callable[[str], None] = print, validate_only: bool = False
               ) -> dict[str, Any] | None:
  """The warm start on its own (launch/sft.py). With `data.task`: the built-in task's
  warm start into <workdir>/sft (or `model.checkpoint`), retrained with `overwrite`, and
  its held-out greedy accuracy (of whole episodes when the rollout mode runs an
  environment). Without: supervised fine-tuning on `sft.train_file` into <workdir>/sft
  (`supervised_warm_start`; an existing one is kept unless `overwrite`). Validates the
  config first; returns {"checkpoint": dir, ...figures}, or None with `validate_only`,
  which stops after the checks (the config, the workdir, the checkpoint's files and the
  data files; nothing is removed or trained).
  Raises ConfigError (one line naming the field or flag)."""
  # The whole config, first: before the warm start trains anything.
  own_data = task_registry.builtin_run(config.data.task) is None
  validate_config(config, num_devices=jax.device_count(), supervised=own_data)
  run_control.check_workdir(workdir)
  if own_data:  # one's own data: model.checkpoint (or from scratch) → sft/
    if not overwrite and os.path.exists(os.path.join(workdir, "sft")):
      raise ConfigError(f"--workdir: {workdir}/sft exists; pass --overwrite to train it again")
    if validate_only:
      supervised_inputs(config)
      return None
    return {"checkpoint": supervised_warm_start(config, workdir, log=log)}
  if validate_only:
    inputs.check_data(config, workdir)
    return None
  directory = build.policy_checkpoint_dir(config, workdir)
  if overwrite and os.path.exists(directory):
    shutil.rmtree(directory)
  inputs.check_data(config, workdir)  # the data files before the warm start trains
  directory = ensure_arith_warm_start(config, workdir, log=log)
  return {"checkpoint": directory, **_greedy_accuracy(config, workdir, directory)}


def _greedy_accuracy(c, workdir: str, directory: str) -> dict[str, float]:
  """Held-out greedy accuracy of the warm start in `directory`: whole episodes with the
  run's environment when the rollout mode runs one, else one response per prompt."""
  _, held_out = inputs.load_examples(c)
  scorer = reward_build.verifiers(c, sorted({e.task for e in held_out}))
  if rollout_modes.rollout_mode(c).needs_environment:
    mesh = build.trainer_mesh(c)
    policy = build.load_policy(c, workdir, mesh)
    sampler = build.build_sampler(c, policy, mesh)
    parts = build.rollout_parts(c, policy, sampler, scorer)
    try:
      return build.build_evaluator(c, parts, held_out, scorer)(samples=1, temperature=0.0)
    finally:
      parts.close()
  model, params = models.load_hf_checkpoint(directory)
  tokenizer = models.Tokenizer.from_directory(directory)
  sampler = sampler_config_lib.build_scheduler(c.sampler, model, params, tokenizer=tokenizer,
                                               seed=c.seed)
  prompts = build.prompt_format(c, tokenizer, models.load_prompt_prefix(directory, tokenizer))
  return evaluate_policy(sampler, prompts, held_out, scorer, samples=1, temperature=0.0,
                         max_new_tokens=c.rollout.max_new_tokens)


def prepare_run(c, workdir: str, log: Callable[[str], None] = print) -> None:
  """Runs the stages config `c` needs in `workdir` before training: the built-in task's
  warm start (`data.task`: trained into `model.checkpoint`, or <workdir>/sft, when missing)
  and the offline data (rollout.mode 'offline' without `data.offline_file`)."""
  if task_registry.builtin_run(c.data.task) is not None:
    ensure_arith_warm_start(c, workdir, log=log)
  ensure_offline_data(c, workdir, log=log)


def ensure_arith_warm_start(c, workdir: str, log: Callable[[str], None] = print) -> str:
  """The arith warm start: trains and saves `policy_checkpoint_dir` unless it exists
  (a 3-layer decoder and the character tokenizer, created locally). Returns the directory."""
  directory = build.policy_checkpoint_dir(c, workdir)
  task = task_registry.get_task(c.data.task)
  if os.path.exists(os.path.join(directory, "config.json")):
    if task.check_warm_start is not None:
      task.check_warm_start(directory)
    log(f"SFT warm start: {directory} (delete it to train a new one)")
    return directory
  log(f"no SFT checkpoint in {directory}: training the arith warm start from scratch "
      f"({c.sft.steps} steps)")
  tokenizer = task.tokenizer()
  model, params = models.init_model(task.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=c.model.hidden_size,
      num_layers=c.model.num_layers, num_heads=c.model.num_heads,
      max_positions=sampler_positions(c)), seed=c.seed)
  prefix = [tokenizer.backend.token_to_id(token) for token in task.prompt_prefix]
  common = dict(seed=c.seed + 17, batch_size=c.sft.batch_size, levels=tuple(c.sft.levels),
                weights=tuple(c.sft.level_weights), prompt_prefix=prefix,
                prompt_length=c.data.prompt_length,
                response_length=rollout_modes.response_length(c),
                direct_fraction=c.sft.direct_fraction, slip_rate=c.sft.carry_slip)
  make_batch = task.demonstrations(tokenizer, **common)
  result = _run_with_bar(model, params, make_batch, c, "SFT warm start")
  # Written aside and renamed, so an interrupted save never looks like a checkpoint.
  partial = directory.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  models.save_policy(partial, model, result.params, tokenizer, list(task.prompt_prefix))
  if os.path.exists(directory):  # a leftover without config.json
    shutil.rmtree(directory)
  os.replace(partial, directory)
  log(f"SFT warm start saved to {directory} (final loss {result.losses[-1]:.4f}, "
      f"{result.seconds:.0f} s)")
  return directory


def supervised_inputs(c) -> list[tuple[str, dict[str, Any]]]:
  """The (where, record) rows of `sft.train_file` (each row's JSON and layout, and its
  characters: `check_characters`) and the files of `model.checkpoint` when one is given,
  checked before anything is tokenised or loads; a ConfigError naming the field, file and
  row. (The rows' lengths in tokens are checked with the tokenizer, which a model from
  scratch trains on the file first.)"""
  response_length = c.sft.response_length or rollout_modes.response_length(c)
  try:
    records = read_records(c.sft.train_file)
    for where, record in records:  # a row too long to fit, before it is rendered
      check_characters(record, where, prompt_length=c.data.prompt_length,
                       response_length=response_length)
  except (OSError, ValueError) as error:
    unfit("sft.train_file", str(error))
  if c.model.checkpoint:  # its files, before the records are tokenised or anything loads
    checkpoint_checks.check_checkpoint_dir(c.model.checkpoint, "config.model.checkpoint")
    inputs.check_checkpoint_family(c.model.checkpoint)
    try:  # as train.py's check: its tokenizer_config.json and templates read
      models.Tokenizer.from_directory(c.model.checkpoint)
    except (OSError, ValueError) as error:
      unfit("model.checkpoint", f"{c.model.checkpoint}: the tokenizer does not load: "
            f"{error}")
  return records


def supervised_warm_start(c, workdir: str, log: Callable[[str], None] = print) -> str:
  """Supervised fine-tuning on one's own data (`sft.train_file`: conversations or
  prompt/completion pairs, loss on the assistant's tokens; data/conversations.py) of
  `model.checkpoint`, or of a model from scratch (`model.*` sizes) with a byte-level BPE
  tokenizer trained on the file; saved to <workdir>/sft, where `launch/train.py
  --config.model.checkpoint=<workdir>/sft` starts from. Returns the directory."""
  directory = os.path.join(workdir, "sft")
  records = supervised_inputs(c)
  model, params, tokenizer, prefix_tokens = _supervised_start(c, records, log)
  prefix = [tokenizer.backend.token_to_id(t) for t in prefix_tokens]
  prompts = build.prompt_format(c, tokenizer, prefix)
  response_length = c.sft.response_length or rollout_modes.response_length(c)
  rows = []
  for where, record in records:
    try:
      rows.append(check_row(supervised_row(record, where, prompts), where,
                            prompt_length=c.data.prompt_length,
                            response_length=response_length))
    except ValueError as error:  # a template error is a ValueError too
      unfit("sft.train_file", str(error))
  log(f"SFT on {len(rows)} rows of {c.sft.train_file} ({c.sft.steps} steps of "
      f"{c.sft.batch_size})")
  make_batch = supervised_batches(rows, batch_size=c.sft.batch_size, seed=c.seed + 17,
                                  prompt_length=c.data.prompt_length,
                                  response_length=response_length, pad_id=tokenizer.pad_id,
                                  packing=c.train.packing)
  result = _run_with_bar(model, params, make_batch, c, "SFT")
  partial = directory.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  models.save_policy(partial, model, result.params, tokenizer, prefix_tokens)
  shutil.rmtree(directory, ignore_errors=True)
  os.replace(partial, directory)
  log(f"SFT checkpoint saved to {directory} (final loss {result.losses[-1]:.4f}, "
      f"{result.seconds:.0f} s)")
  return directory


def _supervised_start(c, records, log):
  """(model, params, tokenizer, prefix tokens) to fine-tune: `model.checkpoint`, or from
  scratch a `model.*`-sized decoder and a BPE tokenizer of `sft.vocab_size` trained on
  the records' text (with ChatML as its chat template)."""
  if c.model.checkpoint:
    model, params = models.load_hf_checkpoint(c.model.checkpoint)
    tokenizer = models.Tokenizer.from_directory(c.model.checkpoint)
    prefix = models.load_prompt_prefix(c.model.checkpoint, tokenizer)
    return model, params, tokenizer, [tokenizer.backend.id_to_token(i) for i in prefix]
  corpus = [text for _, record in records for text in record_texts(record)]
  log(f"no model.checkpoint: a byte-level BPE tokenizer ({c.sft.vocab_size} tokens) and a "
      f"{c.model.num_layers}-layer model from scratch")
  tokenizer = models.train_bpe_tokenizer(corpus, vocab_size=c.sft.vocab_size)
  tokenizer.chat_template = models.tokenizer.CHATML_JINJA
  model, params = models.init_model(scratch_decoder(
      c.model, vocab_size=tokenizer.vocab_size, max_positions=sampler_positions(c)),
      seed=c.seed)
  return model, params, tokenizer, []


def sampler_positions(c) -> int:
  """The positions a model made here needs: the sampler's KV cache length, derived first
  when it is left at 0 and the config was not validated yet (a notebook's, a test's)."""
  if not c.sampler.cache_length:
    fit_sampler_sizes(c)
  return c.sampler.cache_length


def _run_with_bar(model, params, make_batch, c, what: str):
  with loggers_lib.progress_bar(c.sft.steps, what) as progress:  # plain lines in a log
    return run_sft(model, params, make_batch, steps=c.sft.steps,
                   learning_rate=c.sft.learning_rate, progress=progress)


def label_samples(c, policy, sampler, scorer, examples, *, chunk: int = 256,
                  log: Callable[[str], None] = print) -> list[LabelledGroup]:
  """`data.offline_samples` sampled responses per example, with the scorer's verdicts."""
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  sampling = dataclasses.replace(rollout_config_lib.sampling_params(c.rollout, stop),
                                 n=c.data.offline_samples)
  generator = GroupGenerator(sampler, scorer, policy.prompts, sampling=sampling,
                             seed=c.seed + 4049)
  out = []
  for start in range(0, len(examples), chunk):
    for group in generator.generate_groups(examples[start:start + chunk]):
      texts = [policy.tokenizer.decode(policy.tokenizer.truncate_at_eos(r))
               for r in group.responses]
      out.append(LabelledGroup(group.example, tuple(texts), tuple(group.scores),
                               tuple(group.correct)))
    done = min(start + chunk, len(examples))
    accuracy = sum(sum(g.correct) for g in out) / max(1, sum(len(g.correct) for g in out))
    log(f"labelled {done}/{len(examples)} prompts ({accuracy:.1%} of samples correct)")
  return out


def ensure_offline_data(c, workdir: str, log: Callable[[str], None] = print) -> None:
  """Writes <workdir>/offline.jsonl (labelled samples of the warm start) when the rollout
  mode trains on fixed data ('offline'), `data.offline_file` is empty and it does not
  exist yet."""
  if not rollout_modes.rollout_mode(c).fixed_data or c.data.offline_file:
    return
  path = build.offline_path(c, workdir)
  if os.path.exists(path):
    log(f"offline data: {path} (delete it to label new samples)")
    return
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, workdir, mesh)
  examples = inputs.load_examples(c)[0][:c.data.offline_prompts]
  scorer = reward_build.verifiers(c, sorted({e.task for e in examples}))
  sampler = build.build_sampler(c, policy, mesh)
  log(f"no offline data: labelling {c.data.offline_samples} samples of each of "
      f"{len(examples)} prompts into {path}")
  partial = os.path.join(os.path.dirname(path), "offline.partial.jsonl")
  try:
    write_labelled(partial, label_samples(c, policy, sampler, scorer, examples, log=log))
  finally:
    sampler.close()
    scorer.close()
  os.replace(partial, path)  # a crash never leaves a half-written file behind
