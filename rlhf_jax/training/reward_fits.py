"""Training the models a reward reads, from a policy checkpoint: a Bradley-Terry reward
model, a generative judge (GenRM, pairwise) and a process reward model. One function each,
the one that launch/train_rm.py, launch/train_judge.py and launch/train_prm.py call after
parsing their flags (the keyword arguments are the flags, and errors name them); each saves
beside the policy's tokenizer into `output` and returns its JSON summary.

The launchers' file checks are here too (`check_policy_and_output`, `read_flag_file`):
one-line errors naming the flag, before any work.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import jax
import numpy as np

from rlhf_jax import models
from rlhf_jax.algorithms.sft import run_sft
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import read_examples
from rlhf_jax.data import read_pairs
from rlhf_jax.data.jsonl import json_lines
from rlhf_jax.models.hf.checks import check_checkpoint_dir
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards import model_training as rt
from rlhf_jax.rewards import pairwise
from rlhf_jax.rewards.prm import label_responses
from rlhf_jax.rewards.prm import step_end_token_ids
from rlhf_jax.rewards.router import router_for_tasks
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import registry as task_registry
from rlhf_jax.training.loggers import progress_bar
from rlhf_jax.training.run_control import check_workdir

JUDGE_KINDS = ("genrm", "genrm_reference", "pairwise")
# The built-in task whose generated data the fits take when no data file is given.
DEMO_TASK = "arith"
T = TypeVar("T")


def split_held_out(items: Sequence[T], held_out: Sequence[T] | None, fraction: float
                   ) -> tuple[list[T], list[T]]:
  """(train, held-out): `held_out` when given, else the last `fraction` of `items`."""
  if held_out is not None:
    return list(items), list(held_out)
  cut = len(items) - max(1, int(round(len(items) * fraction)))
  if cut < 1:
    raise ValueError(f"{len(items)} items are too few to hold out {fraction:.0%}.")
  return list(items[:cut]), list(items[cut:])


def check_policy_and_output(policy: str, output: str) -> None:
  """--policy is a checkpoint directory that loads (its files, not its tensors) and
  --output can become a directory; else a ConfigError naming the flag."""
  check_checkpoint_dir(policy, f"--policy={policy}")
  check_workdir(output, "--output")


def read_flag_file(flag: str, reader: Callable[[str], T], path: str) -> T:
  """`reader(path)` for the file of --<flag>; a missing, empty or malformed file (the
  readers' OSError / ValueError, which name the file and line) is a ConfigError."""
  try:
    return reader(path)
  except (OSError, ValueError) as error:
    raise ConfigError(f"--{flag}={path}: {error}") from None


def train_reward_model(*, policy: str, output: str, train_pairs: str = "",
                       eval_pairs: str = "", eval_fraction: float = 0.1,
                       num_pairs: int = 4000, steps: int = 300, batch_size: int = 32,
                       learning_rate: float = 1e-3, prompt_length: int = 64,
                       response_length: int = 65, seed: int = 0) -> dict[str, Any]:
  """A Bradley-Terry reward model (the policy's backbone, a scalar head) on the pairs of
  `train_pairs` (default: generated arith pairs), held-out pair accuracy before and after."""
  check_policy_and_output(policy, output)
  pairs = (read_flag_file("train_pairs", read_pairs, train_pairs) if train_pairs
           else _generated("pairs", seed, num_pairs))
  held = read_flag_file("eval_pairs", read_pairs, eval_pairs) if eval_pairs else None
  train, held_out = split_held_out(pairs, held, eval_fraction)
  model, params = rt.scalar_model_from_policy(policy)
  layout = rt.policy_layout(policy, prompt_length, response_length)
  with progress_bar(steps, "reward model") as progress:
    result = rt.train_bradley_terry(model, params, layout, train, held_out, steps=steps,
                                    batch_size=batch_size, learning_rate=learning_rate,
                                    seed=seed, progress=progress)
  rt.save_beside_policy(output, model, result.params, policy)
  return {"checkpoint": output, "train_pairs": len(train), "held_out_pairs": len(held_out),
          "pair_accuracy_before": result.before, "pair_accuracy": result.after,
          "final_loss": result.losses[-1], "seconds": round(result.seconds, 1)}


def _generated(kind: str, seed: int, count: int) -> list:
  """`count` generated rows of `kind` of the built-in task's reward-model data
  (`DEMO_TASK`'s record: `reward_data`)."""
  return task_registry.get_task(DEMO_TASK).reward_data(kind, seed, count)


def read_judged(path: str) -> list[tuple[Example, str, bool]]:
  """(Example, response, correct) triples of a JSONL file; errors name line and field."""
  out = []
  for number, record in json_lines(path):
    for field, kind in (("prompt", str), ("answer", str), ("response", str), ("correct", bool)):
      if not isinstance(record.get(field), kind):
        raise ValueError(f"{path}:{number}: field {field!r} must be {kind.__name__}.")
    out.append((Example(record["prompt"], record["answer"], record.get("task", ""),
                        record.get("metadata") or {}), record["response"], record["correct"]))
  return out


def judge_questions(kind: str, *, judged: str = "", pairs: str = "",
                    reference_key: str = "reference", num_examples: int = 4000,
                    seed: int = 0) -> tuple[list[tuple[str, str]], tuple[str, str]]:
  """The (question, verdict) texts of a judge of `kind` (JUDGE_KINDS), and its two verdict
  texts: from `judged` / `pairs` files, or generated arith data."""
  if kind not in JUDGE_KINDS:
    raise ConfigError(f"--kind={kind!r}: must be one of {', '.join(JUDGE_KINDS)}")
  if kind in ("genrm", "genrm_reference"):
    with_reference = kind == "genrm_reference"
    rows = (read_flag_file("judged", read_judged, judged) if judged
            else _generated("judged_with_references" if with_reference else "judged",
                            seed, num_examples))
    template = genrm.REFERENCE_TEMPLATE if with_reference else genrm.GT_TEMPLATE
    return rt.genrm_sft_pairs(rows, template=template, yes="Y", no="N",
                              reference_key=reference_key), ("Y", "N")
  preference = (read_flag_file("pairs", read_pairs, pairs) if pairs
                else _generated("pairs", seed, num_examples // 2))
  return rt.pairwise_sft_pairs(preference, template=pairwise.PAIR_TEMPLATE, first="A",
                               second="B"), ("A", "B")


def train_judge(*, kind: str, policy: str, output: str, judged: str = "", pairs: str = "",
                reference_key: str = "reference", num_examples: int = 4000,
                eval_fraction: float = 0.1, steps: int = 400, batch_size: int = 32,
                learning_rate: float = 1e-3, question_length: int = 256,
                seed: int = 0) -> dict[str, Any]:
  """A generative judge of `kind` by SFT on its verdict token, held-out verdict accuracy
  (the likelier verdict token) before and after."""
  check_policy_and_output(policy, output)
  examples, verdicts = judge_questions(kind, judged=judged, pairs=pairs,
                                       reference_key=reference_key,
                                       num_examples=num_examples, seed=seed)
  rng = np.random.default_rng(seed)
  examples = [examples[i] for i in rng.permutation(len(examples))]
  train, held_out = split_held_out(examples, None, eval_fraction)
  model, params = models.load_hf_checkpoint(policy)
  tokenizer = models.Tokenizer.from_directory(policy)
  prefix = models.load_prompt_prefix(policy, tokenizer)
  rows = rt.sft_rows(tokenizer, prefix, train, prompt_length=question_length)
  accuracy = lambda p: rt.verdict_accuracy(model, p, tokenizer, prefix, held_out, verdicts,
                                           length=question_length)
  before = accuracy(params)
  take = lambda picked: jax.tree.map(lambda x: x[picked], rows)
  make_batch = lambda step: take(rng.integers(0, len(train), batch_size))
  with progress_bar(steps, f"{kind} judge") as progress:
    result = run_sft(model, params, make_batch, steps=steps, learning_rate=learning_rate,
                     progress=progress)
  rt.save_beside_policy(output, model, result.params, policy)
  return {"checkpoint": output, "kind": kind, "train_questions": len(train),
          "held_out_questions": len(held_out), "verdict_accuracy_before": before,
          "verdict_accuracy": accuracy(result.params), "final_loss": result.losses[-1],
          "seconds": round(result.seconds, 1)}


def policy_sampler(policy: str, *, prompt_length: int, max_new_tokens: int, seed: int):
  """(sampler, tokenizer, prefix) of the policy, with room for a prompt and a partial
  response as the prompt of a completion."""
  model, params = models.load_hf_checkpoint(policy)
  tokenizer = models.Tokenizer.from_directory(policy)
  length = prompt_length + max_new_tokens
  sampler_config = sampler_config_lib.sampler_config(
      num_slots=64, cache_length=length + max_new_tokens, prompt_buckets=(length,))
  sampler = sampler_config_lib.build_scheduler(sampler_config, model, params,
                                               tokenizer=tokenizer, seed=seed)
  return sampler, tokenizer, models.load_prompt_prefix(policy, tokenizer)


def sample_and_label(sampler, tokenizer, prefix, examples, *, samples: int, completions: int,
                     max_new_tokens: int, step_delimiter: str, seed: int):
  """(examples, responses, labels) of `samples` policy responses per example, each step
  labelled by `completions` completions per probed prefix (rewards/prm.py)."""
  out = sampler.generate([prefix + tokenizer.encode(e.prompt) for e in examples],
                         SamplingParams(temperature=1.0, n=samples,
                                        max_new_tokens=max_new_tokens,
                                        stop_token_ids=(tokenizer.eos_id,), seed=seed))
  flat = [(e, tokenizer.decode(s.token_ids)) for e, group in zip(examples, out) for s in group]
  verifier = router_for_tasks(sorted({e.task for e in examples}))
  try:
    labels = label_responses(sampler, tokenizer, verifier, [e for e, _ in flat],
                             [r for _, r in flat], prefix=prefix, completions=completions,
                             max_new_tokens=max_new_tokens,
                             step_end_ids=step_end_token_ids(tokenizer, step_delimiter),
                             seed=seed + 1)
  finally:
    verifier.close()
  return [e for e, _ in flat], [r for _, r in flat], labels


def train_prm(*, policy: str, output: str, prompts: str = "", num_prompts: int = 256,
              samples: int = 4, completions: int = 4, step_delimiter: str = "\n",
              eval_fraction: float = 0.1, steps: int = 300, batch_size: int = 32,
              learning_rate: float = 1e-3, prompt_length: int = 64, max_new_tokens: int = 64,
              seed: int = 0) -> dict[str, Any]:
  """A process reward model: policy samples labelled step by step, then regression on the
  0/1 step labels at step-end tokens; held-out Brier score (beside a constant predictor's)
  and step-label accuracy."""
  check_policy_and_output(policy, output)
  examples = (read_flag_file("prompts", read_examples, prompts)[:num_prompts] if prompts
              else task_registry.get_task(DEMO_TASK).generate(seed + 5, num_prompts, (1, 2),
                                                              None))
  train_prompts, held_prompts = split_held_out(examples, None, eval_fraction)
  layout = rt.policy_layout(policy, prompt_length, max_new_tokens + 1)
  step_ends = step_end_token_ids(layout.tokenizer, step_delimiter)
  rows, stats = {}, {}
  sampler, tokenizer, prefix = policy_sampler(policy, prompt_length=prompt_length,
                                              max_new_tokens=max_new_tokens, seed=seed)
  for name, part in (("train", train_prompts), ("held_out", held_prompts)):
    part_examples, responses, labels = sample_and_label(
        sampler, tokenizer, prefix, part, samples=samples, completions=completions,
        max_new_tokens=max_new_tokens, step_delimiter=step_delimiter, seed=seed)
    rows[name] = rt.step_targets(layout, [e.prompt for e in part_examples], responses, labels,
                                 step_ends)
    flat = np.concatenate([np.asarray(x) for x in labels])
    stats[f"{name}_responses"] = len(responses)
    stats[f"{name}_steps"] = int(flat.size)
    stats[f"{name}_unrecoverable_share"] = float(np.mean(flat == 0))
  model, params = rt.scalar_model_from_policy(policy)
  with progress_bar(steps, "PRM") as progress:
    result = rt.train_prm(model, params, rows["train"], rows["held_out"],
                          response_length=layout.response_length, steps=steps,
                          batch_size=batch_size, learning_rate=learning_rate, seed=seed,
                          progress=progress)
  rt.save_beside_policy(output, model, result.params, policy)
  return {"checkpoint": output, **stats, "step_label_mse_before": result.before["mse"],
          "step_label_mse": result.after["mse"],
          "constant_baseline_mse": rt.constant_baseline_mse(rows["train"], rows["held_out"]),
          "step_label_accuracy": result.after["accuracy"], "final_loss": result.losses[-1],
          "seconds": round(result.seconds, 1)}
