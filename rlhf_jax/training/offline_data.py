"""Offline data for DPO and DQO: verifier-labelled samples of the starting policy, and the
offline rollout over a file of them (rollout/offline.py).

`label_samples` samples `data.offline_samples` responses to each of the first
`data.offline_prompts` training prompts with the starting policy at the rollout
temperature and scores them with the run's verifier; launch/label_samples.py writes
them, and for the arith variant train.py writes <workdir>/offline.jsonl first when
`data.offline_file` is empty.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax

from rlhf_jax.algorithms.rollout import response_logprobs
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import LabelledGroup
from rlhf_jax.data import read_labelled
from rlhf_jax.data import write_labelled
from rlhf_jax.rollout import GroupGenerator
from rlhf_jax.rollout import config as rollout_config_lib
from rlhf_jax.rollout.offline import OfflineRollout
from rlhf_jax.rollout.offline import cache_reference_logprobs
from rlhf_jax.rollout.offline import encode_groups


def offline_path(c, workdir: str) -> str:
  """`data.offline_file`, or <workdir>/offline.jsonl (the arith variant's generated one)."""
  return c.data.offline_file or os.path.join(workdir, "offline.jsonl")


def label_samples(c, policy, sampler, scorer, examples, *, chunk: int = 256,
                  log: Callable[[str], None] = print) -> list[LabelledGroup]:
  """`data.offline_samples` sampled responses per example, with the scorer's verdicts."""
  stop = (policy.tokenizer.eos_id,) if c.rollout.stop_at_eos else ()
  sampling = dataclasses.replace(rollout_config_lib.sampling_params(c.rollout, stop),
                                 n=c.data.offline_samples)
  generator = GroupGenerator(sampler, scorer, policy.tokenizer, sampling=sampling,
                             prefix=policy.prefix, prompt_length=c.data.prompt_length,
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
  """Writes <workdir>/offline.jsonl (labelled samples of the warm start) when rollout.mode
  is 'offline', `data.offline_file` is empty and it does not exist yet."""
  if c.rollout.mode != "offline" or c.data.offline_file:
    return
  path = offline_path(c, workdir)
  if os.path.exists(path):
    log(f"offline data: {path} (delete it to label new samples)")
    return
  from rlhf_jax.training import build  # pylint: disable=import-outside-toplevel
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, workdir, mesh)
  examples = build.load_examples(c)[0][:c.data.offline_prompts]
  scorer = build.build_verifiers(c, sorted({e.task for e in examples}))
  sampler = build.build_sampler(c, policy, mesh)
  log(f"no offline data: labelling {c.data.offline_samples} samples of each of "
      f"{len(examples)} prompts into {path}")
  partial = os.path.join(os.path.dirname(path), "offline.partial.jsonl")
  try:
    write_labelled(partial, label_samples(c, policy, sampler, scorer, examples, log=log))
  finally:
    for closing in (sampler, scorer):
      getattr(closing, "close", lambda: None)()
  os.replace(partial, path)  # a crash never leaves a half-written file behind


def offline_rollout(c, policy, workdir: str, log: Callable[[str], None] = print
                    ) -> OfflineRollout:
  """The rollout over the offline file, with the starting policy's log-probs of every
  response cached (one forward pass over the data) in the rows' `sampler_logprobs`."""
  path = offline_path(c, workdir)
  try:
    groups, counts = encode_groups(read_labelled(path), policy.tokenizer, prefix=policy.prefix,
                                   prompt_length=c.data.prompt_length,
                                   response_length=c.rollout.max_new_tokens,
                                   group_size=c.rollout.group_size,
                                   pairs=c.algorithm.learner == "dpo")
  except (OSError, ValueError) as error:
    raise ConfigError(f"config.data.offline_file={path!r}: {error}") from None
  shapes = dict(prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
                pad_id=policy.tokenizer.pad_id)
  # Always: they are π_ref's (reference 'cached') and the data's behaviour policy μ (DQO's
  # importance weights), the starting policy that sampled the labelled responses.
  forward = jax.jit(lambda params, rows: response_logprobs(policy.model, params, rows))
  cache_reference_logprobs(groups, lambda rows: forward(policy.params, rows),
                           chunk=c.rollout.prompts_per_step, **shapes)
  log(f"offline data: {len(groups)} groups of {c.rollout.group_size} from {path} "
      f"({counts['dropped']} without a preference dropped, {counts['truncated']} responses "
      f"cut to rollout.max_new_tokens)")
  return OfflineRollout(groups, prompts_per_step=c.rollout.prompts_per_step, seed=c.seed,
                        shuffle=c.data.shuffle, **shapes)
