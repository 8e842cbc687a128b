"""rollout.mode = "offline": a step's groups come from a file of labelled responses
(`data/labelled.py`: verifier-labelled samples or preference pairs), not from the sampler.

DPO and DQO train on them (Rafailov et al.; Liu et al. arXiv:2410.09302). The responses
are tokenised once; the reference policy's per-token log-probs of every response can
be computed once as well (`cache_reference_logprobs`) and ride in the batch's
`sampler_logprobs` (the data's behaviour policy is the starting policy, which is also
the reference), so a training step runs no reference forward.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from rlhf_jax.batch import RolloutBatch
from rlhf_jax.batch import response_logprobs
from rlhf_jax.config_errors import invalid
from rlhf_jax.data import LabelledGroup
from rlhf_jax.data import PromptStream
from rlhf_jax.data import read_labelled
from rlhf_jax.parallel import run_in_chunks
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rollout.generation import Group
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import pack_groups
from rlhf_jax.rollout.base import StreamRollout


def encode_groups(labelled: Sequence[LabelledGroup], prompts: PromptFormat, *,
                  response_length: int, group_size: int,
                  pairs: bool = False) -> tuple[list[Group], dict[str, int]]:
  """Token-level Groups of `group_size` responses (response + EOS) from labelled groups,
  and counts: `dropped` groups, `truncated` responses. Prompts are rendered by `prompts`
  (the run's PromptFormat: prefix, chat template, prompt length).

  With group_size 2, groups are reduced to their best and worst responses (the first
  is the chosen one) and groups without a preference are dropped; otherwise every group must have exactly
  `group_size` responses. A response longer than R tokens is cut to R (TRL's
  truncation) and marked truncated.

  Raises:
    ValueError: naming the group of a prompt that does not fit or of a group of
      the wrong size.
  """
  groups, counts = [], {"dropped": 0, "truncated": 0}
  for index, item in enumerate(labelled):
    if pairs and len(item.responses) >= 2:
      item = item.best_and_worst()
      if item is None:
        counts["dropped"] += 1
        continue
    if len(item.responses) != group_size:
      raise ValueError(f"offline group {index} has {len(item.responses)} responses; set "
                       f"rollout.group_size={len(item.responses)} (it is {group_size}): "
                       "every group of the file must have that many.")
    tokenizer = prompts.tokenizer
    prompt = prompts.encode(item.example, f"offline group {index}")
    try:
      responses = [tokenizer.encode(text) + [tokenizer.eos_id] for text in item.responses]
    except Exception as error:  # pylint: disable=broad-except  # the tokenizers library's own
      raise ValueError(f"offline group {index}: the policy's tokenizer cannot encode it "
                       f"({error})") from None
    truncated = [len(r) > response_length for r in responses]
    counts["truncated"] += sum(truncated)
    responses = [r[:response_length] for r in responses]
    groups.append(Group(example=item.example, prompt_ids=prompt, responses=responses,
                        logprobs=[[0.0] * len(r) for r in responses],
                        scores=list(item.scores), correct=list(item.correct),
                        truncated=truncated, failures=[""] * group_size,
                        # The data's behaviour policy is the starting policy: version 0.
                        versions=[[0] * len(r) for r in responses]))
  if not groups:
    raise ValueError("no offline group has a preference between its responses (all "
                     "scores tie in every group).")
  return groups, counts


def cache_reference_logprobs(groups: list[Group], logprobs_fn: Callable[[RolloutBatch],
                                                                        np.ndarray], *,
                             chunk: int, prompt_length: int, response_length: int,
                             pad_id: int) -> None:
  """Sets every group's `logprobs` to the reference's per-token log-probs of its responses,
  computed by `logprobs_fn` ([B, R] of a packed batch) over fixed chunks of `chunk` groups'
  rows (`run_in_chunks`: one shape, one compile)."""
  batch = pack_groups(groups, prompt_length=prompt_length, response_length=response_length,
                      pad_id=pad_id).batch
  rows = iter(run_in_chunks(logprobs_fn, [batch], chunk * len(groups[0].responses)))
  for group in groups:
    group.logprobs = [list(map(float, next(rows)[:len(r)])) for r in group.responses]


class OfflineRollout(StreamRollout):
  """`prompts_per_step` labelled groups per step, in a fresh seeded order each epoch.

  Args:
    groups: the encoded groups (`encode_groups`), logprobs cached or zeros.
    prompts_per_step: groups per step.
    prompt_length: P of the batch.
    response_length: R of the batch.
    pad_id: the tokenizer's pad id.
    seed: seeds the stream's order.
    shuffle: whether the stream shuffles.
  """

  def __init__(self, groups: list[Group], *, prompts_per_step: int, prompt_length: int,
               response_length: int, pad_id: int, seed: int, shuffle: bool = True):
    self.stream = PromptStream(groups, seed=seed, shuffle=shuffle)
    self.prompts_per_step = prompts_per_step
    self.prompt_length, self.response_length, self.pad_id = (prompt_length, response_length,
                                                             pad_id)

  def collect(self) -> Rollouts:
    """The next groups, packed."""
    return pack_groups(self.stream.take(self.prompts_per_step),
                       prompt_length=self.prompt_length, response_length=self.response_length,
                       pad_id=self.pad_id)

  def state(self) -> dict[str, Any]:
    """JSON-able state (the stream position) for checkpoints."""
    return {"stream": self.stream.state()}

  def restore(self, state: dict[str, Any]) -> None:
    """Restores `state()`."""
    self.stream.restore(state["stream"])


def offline_rollout(c, policy, path: str, log: Callable[[str], None] = print, *,
                    pairs: bool) -> OfflineRollout:
  """The rollout over the labelled groups of `path` for config `c` and the starting
  `policy` (model, params, tokenizer, prefix), with the policy's log-probs of every
  response cached (one forward pass over the data) in the rows' `sampler_logprobs`;
  `pairs`: each group reduced to its best and worst (the learner spec's `pairs`)."""
  try:
    groups, counts = encode_groups(read_labelled(path), policy.prompts,
                                   response_length=c.rollout.max_new_tokens,
                                   group_size=c.rollout.group_size,
                                   pairs=pairs)
  except (OSError, ValueError) as error:
    invalid("data.offline_file", path, str(error))
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
