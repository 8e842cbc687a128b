"""The `reward` config section (and the `critic` section, which a PRM can start), and
their validation.

`reward.route` picks where each sample's reward comes from (rewards/hybrid.py): the
rule verifiers ('verifier', the default), one model route for every sample ('rm',
'genrm_gt', 'genrm_reference', 'pairwise'), or 'hybrid' routing per sample. A process
reward model (`reward.process.checkpoint`) adds step rewards on top of any route.
Reward models and judges are HF checkpoint directories (launch/train_rm.py,
launch/train_prm.py, launch/train_judge.py write them).
"""

from __future__ import annotations

import functools
import logging
import os
import re

import ml_collections

from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.rewards import functions
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards import hybrid
from rlhf_jax.rewards import pairwise
from rlhf_jax.rewards.judge import check_template
from rlhf_jax.sandbox.jobs import ISOLATIONS
from rlhf_jax.sandbox.jobs import Limits
from rlhf_jax.sandbox.jobs import memory_scope
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section
from rlhf_jax.sampling import config as sampler_config_lib

MATH_EXTRACTORS = ("auto", "boxed", "answer_line", "gsm8k", "last_number")


def reward_config() -> ml_collections.ConfigDict:
  """The `reward` section with its defaults (one comment per field): the rule verifiers,
  reward functions, the code sandbox, and the model-based fields (`add_reward_model_fields`)."""
  r = ml_collections.ConfigDict()
  r.correct_score = 1.0  # Reward of a verified answer (DAPO: +1).
  r.wrong_score = -1.0  # Reward of a wrong answer (DAPO: −1).
  r.failure_score = -1.0  # Reward when the verifier raises or times out.
  r.timeout_s = 5.0  # Per-sample rule-verifier time limit (arith, math).
  r.workers = 2  # Rule-verifier worker processes (killed and replaced when they hang).
  # Math answers (task 'math', rewards/math.py): where the final answer is: 'auto'
  # (\boxed{}, else an "Answer:" line, else GSM8K's "#### N"), 'boxed', 'answer_line',
  # 'gsm8k', 'last_number', or 're:<regex with one group>'.
  r.math_extractor = "auto"
  # Reward functions of your own (rewards/functions.py): "package.module:fn" or
  # "path/file.py:fn", several as "a:f,b:g"; TRL's fn(prompts, completions, **columns) or
  # verl's compute_score(data_source, solution_str, ground_truth, extra_info). Set, they
  # are the training reward of every sample (the verifiers still measure accuracy).
  r.function = ""
  r.function_weights = ""  # Their weights, "1.0,0.5" (empty: 1 each).
  # A sample that no function scores (each returned None): 'zero' (reward 0, TRL's),
  # 'failure' (reward.failure_score, counted as a failure) or 'drop' (out of its group's
  # statistics and the loss). Each way a console line counts them.
  r.unscored = "zero"
  r.function_timeout_s = 60.0  # One call of a function (a TRL function's holds the whole step).
  r.worker_memory_mb = 4096  # A function worker's memory with what it starts (0: no limit).
  # Steps in a row in which every sample's reward failed before the run stops, naming the
  # reason (0: never stop).
  r.max_failed_steps = 3
  r.sandbox = ml_collections.ConfigDict()  # code tasks ('code', 'pycalc'): rewards/code.py
  r.sandbox.timeout_s = 5.0  # Wall clock (and CPU seconds) per program.
  r.sandbox.memory_mb = 512  # Memory of a program's processes together (docs/sandbox.md).
  r.sandbox.workers = 0  # Concurrent sandboxes (0: 4 per core).
  # 'namespaces' (bubblewrap: no network, private /tmp, own PID namespace) or 'rlimits'
  # (machines without user namespaces; weaker, see docs/sandbox.md).
  r.sandbox.isolation = "namespaces"
  add_reward_model_fields(  # route, rm, genrm, pairwise, process
      r, judge_prompt_buckets=(2048, 3072))
  return r


def critic_config() -> ml_collections.ConfigDict:
  """The `critic` section: a critic started from a scalar-head model (a PRM)."""
  critic = ml_collections.ConfigDict()
  # HF directory of a scalar-head model (a PRM: launch/train_prm.py) whose weights start
  # the critic (Dai et al.); empty: the policy's backbone with a zero value head.
  critic.init_from = ""
  return critic


def check_reward_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `reward` section: the rule rewards, the reward functions (imported and
  their signatures checked), the reward models and judges (their checkpoints exist), and
  the PRM and critic files (`critic.init_from`)."""
  del checking
  validate_rule_rewards(c.reward)
  validate_reward_functions(c.reward)
  validate_reward_models(c)


SECTION = Section("reward", at="reward", fields=reward_config, check=check_reward_section,
                  after=("critic", "data", "rollout"))
# Its one field is checked with the PRM's (`check_reward_section`); how a critic fits the
# estimator is a rule across sections (training/config.py).
CRITIC_SECTION = Section("critic", at="critic", fields=critic_config)


def add_reward_model_fields(r: ml_collections.ConfigDict, *, judge_prompt_buckets=(128, 256)
                            ) -> None:
  """Adds the model-based fields to the `reward` section `r` (one comment per field);
  the judges' questions are padded to `judge_prompt_buckets` (a question holds the prompt
  and one response, two for the pairwise judge, plus the template)."""
  # 'verifier', 'rm', 'genrm_gt', 'genrm_reference', 'pairwise', or 'hybrid' (per sample:
  # verifier if the task has one, else GenRM w/ GT if there is an answer, else GenRM w/
  # reference if the metadata has one, else the RM; Shen et al. §3).
  r.route = "verifier"
  # Also run the rule verifiers on model-routed samples whose task has one: the true
  # accuracy beside the proxy reward (reward/<route>/true_accuracy). Never a reward.
  r.monitor = True
  r.rm = ml_collections.ConfigDict()  # Bradley–Terry reward model (launch/train_rm.py)
  r.rm.checkpoint = ""  # HF directory with a scalar head.
  r.rm.batch_size = 64  # Rows per jitted scoring forward.
  r.rm.correct_threshold = 0.0  # A response counts as correct when its score exceeds this.
  r.genrm = ml_collections.ConfigDict()  # generative judge vs a reference (rewards/genrm.py)
  r.genrm.checkpoint = ""  # HF directory of the judge LM (launch/train_judge.py --kind=genrm).
  r.genrm.yes = "Y"  # The verdict tokens: the reward is P(yes).
  r.genrm.no = "N"
  r.genrm.template_gt = genrm.GT_TEMPLATE  # {prompt} {answer} {response}
  r.genrm.template_reference = genrm.REFERENCE_TEMPLATE  # {prompt} {reference} {response}
  r.genrm.reference_key = "reference"  # metadata key of the reference response.
  r.genrm.min_verdict_mass = 0.5  # Less probability on Y+N: an off-format answer (failure).
  r.pairwise = ml_collections.ConfigDict()  # Pairwise-PPO's judge (rewards/pairwise.py)
  r.pairwise.checkpoint = ""  # HF directory of the judge LM (train_judge.py --kind=pairwise).
  r.pairwise.first = "A"  # Verdict token: the first response is better.
  r.pairwise.second = "B"  # Verdict token: the second is better.
  r.pairwise.template = pairwise.PAIR_TEMPLATE  # {prompt} {first} {second}
  r.pairwise.anchor_key = "solution"  # 'answer' or the metadata key of the anchor response.
  r.pairwise.centre = 0.5  # Reward = P(y beats the anchor) − centre.
  r.pairwise.min_verdict_mass = 0.5  # Less probability on A+B: an off-format answer (failure).
  # The judges' sampler (GenRM and pairwise): in-process engines over the judges'
  # weights, or `address` of a server that serves the judge (one judge per server; the
  # judge's checkpoint directory still gives its tokenizer and prompt format).
  r.judge_sampler = sampler_config_lib.sampler_config(
      num_slots=64, cache_length=max(judge_prompt_buckets) + 8,
      prompt_buckets=tuple(judge_prompt_buckets))
  r.process = ml_collections.ConfigDict()  # process reward model (rewards/prm.py)
  r.process.checkpoint = ""  # HF directory with a scalar head (launch/train_prm.py); empty: off.
  r.process.step_delimiter = "\n"  # A step ends at a token containing this text.
  r.process.batch_size = 64  # Rows per jitted scoring forward.


def routes_needed(r) -> tuple[str, ...]:
  """The model routes `reward.route` uses (hybrid: every configured one)."""
  if r.route == "hybrid":
    configured = {"rm": r.rm.checkpoint, "genrm_gt": r.genrm.checkpoint,
                  "genrm_reference": r.genrm.checkpoint}
    return tuple(route for route, directory in configured.items() if directory)
  return () if r.route == "verifier" else (r.route,)


def _check_checkpoint(field: str, directory: str, why: str) -> None:
  if not directory:
    invalid(field, directory, f"an HF checkpoint directory is required{why}")
  if not os.path.exists(os.path.join(directory, "config.json")):
    invalid(field, directory, "must be an HF checkpoint directory (it has no config.json)")


def validate_reward_models(c) -> None:
  """Raises ConfigError naming the `reward.*` / `critic.*` field of an impossible
  model-based reward setting (before anything loads). The judges' fields are checked
  whichever route is picked; checkpoints only where a route or feature uses them."""
  r = c.reward
  one_of("reward.route", r.route, hybrid.ROUTE_MODES)
  routes = routes_needed(r)
  if r.route == "hybrid" and not routes and not r.function:
    invalid("reward.route", r.route, "needs at least one of reward.rm.checkpoint, "
            "reward.genrm.checkpoint, reward.function")
  if r.function and r.route == "hybrid" and routes:
    invalid("reward.function", r.function, "takes every sample without a verifier in "
            f"reward.route='hybrid', so the model routes {list(routes)} would never be used; "
            "clear their checkpoints, or reward.function")
  if r.function and r.route not in ("verifier", "hybrid"):
    invalid("reward.function", r.function, f"must be empty with reward.route={r.route!r} "
            "(a function is the reward with route 'verifier', or a route of 'hybrid')")
  served = (" (a served judge: its tokenizer and prompt format are read from here)"
            if r.judge_sampler.address else "")
  for route in routes:
    if route == "rm":
      _check_checkpoint("reward.rm.checkpoint", r.rm.checkpoint,
                        f" for reward.route={r.route!r}")
    elif route.startswith("genrm"):
      _check_checkpoint("reward.genrm.checkpoint", r.genrm.checkpoint,
                        f" for reward.route={r.route!r}{served}")
    elif route == "pairwise":
      _check_checkpoint("reward.pairwise.checkpoint", r.pairwise.checkpoint,
                        f" for reward.route='pairwise'{served}")
  _validate_judges(r)
  if any(route != "rm" for route in routes):
    # The longest question: the prompt and one response (the pairwise judge: the response
    # and an anchor of the same cap), before the template's own text.
    responses = 2 if "pairwise" in routes else 1
    needed = c.data.prompt_length + responses * c.rollout.max_new_tokens
    if max(r.judge_sampler.prompt_buckets) < needed:
      invalid("reward.judge_sampler.prompt_buckets", tuple(r.judge_sampler.prompt_buckets),
              f"the largest must exceed {needed} tokens, the longest judge question "
              f"(data.prompt_length + {responses} × rollout.max_new_tokens; raise "
              "cache_length too)")
  at_least(r.rm, "reward.rm", ("batch_size",))
  at_least(r.process, "reward.process", ("batch_size",))
  if not r.process.step_delimiter:
    invalid("reward.process.step_delimiter", r.process.step_delimiter, "must be non-empty "
            "text (a step ends at a token containing it)")
  _validate_process_and_critic(c)


def _validate_judges(r) -> None:
  """The GenRM and pairwise judges' verdicts, templates, keys and sampler."""
  check_template(r.genrm.template_gt, genrm.TEMPLATE_FIELDS["gt"],
                 genrm.TEMPLATE_FIELDS["gt"][1:], "reward.genrm.template_gt")
  check_template(r.genrm.template_reference, genrm.TEMPLATE_FIELDS["reference"],
                 genrm.TEMPLATE_FIELDS["reference"][1:], "reward.genrm.template_reference")
  check_template(r.pairwise.template, pairwise.TEMPLATE_FIELDS,
                 pairwise.TEMPLATE_FIELDS[1:], "reward.pairwise.template")
  for judge, verdicts, key in (("genrm", ("yes", "no"), "reference_key"),
                               ("pairwise", ("first", "second"), "anchor_key")):
    section = r[judge]
    for verdict in verdicts:
      if not section[verdict]:
        invalid(f"reward.{judge}.{verdict}", section[verdict], "must be non-empty text (one "
                "token of the judge's tokenizer)")
    if section[verdicts[0]] == section[verdicts[1]]:
      invalid(f"reward.{judge}.{verdicts[1]}", section[verdicts[1]], "must differ from "
              f"reward.{judge}.{verdicts[0]}")
    if not section[key]:
      invalid(f"reward.{judge}.{key}", section[key], "must be a non-empty metadata key")
    check_range(f"reward.{judge}.min_verdict_mass", section.min_verdict_mass, low=0, high=1)
  sampler_config_lib.validate_sampler_config(r.judge_sampler, "reward.judge_sampler")


def _validate_process_and_critic(c) -> None:
  """The files of a PRM (`reward.process`) and of a critic started from one; how they fit
  the estimator is a cross-section rule (training/config.py)."""
  if c.reward.process.checkpoint:
    _check_checkpoint("reward.process.checkpoint", c.reward.process.checkpoint, "")
  if c.critic.init_from:
    _check_checkpoint("critic.init_from", c.critic.init_from, "")


def validate_reward_functions(r) -> None:
  """`reward.function` / `function_weights`: each function imports and fits TRL's or
  verl's signature (rewards/functions.py), before any work."""
  if r.function_weights and not r.function:
    invalid("reward.function_weights", r.function_weights, "must be empty without "
            "reward.function")
  one_of("reward.unscored", r.unscored, ("zero", "failure", "drop"))
  if r.function and r.unscored == "drop" and r.route != "verifier":
    # a hybrid route mixes the functions with scorers whose samples all count
    invalid("reward.unscored", "drop", f"needs reward.route='verifier' (the functions are "
            f"the reward), not {r.route!r} (use 'zero' or 'failure')")
  check_range("reward.function_timeout_s", r.function_timeout_s, low=0, low_open=True)
  if not isinstance(r.worker_memory_mb, int) or r.worker_memory_mb < 0:
    invalid("reward.worker_memory_mb", r.worker_memory_mb, "must be an int >= 0 (0: no limit)")
  check_range("reward.max_failed_steps", r.max_failed_steps, low=0, note="(0: never stop)")
  if r.function:
    functions.parse_reward_config(r)


@functools.cache
def memory_bound_note(memory_mb: int) -> str:
  """"" where `reward.sandbox.memory_mb` bounds a code job's processes together (a cgroup
  can be made here), else the one line that says it bounds each process only."""
  scope, why = memory_scope()
  if scope == "job":
    return ""
  processes = Limits().max_processes
  return (f"reward.sandbox.memory_mb={memory_mb} bounds each sandboxed process, not the job "
          f"({why}): a code job may use up to {memory_mb} MB × {processes} processes "
          "(docs/sandbox.md)")


def validate_rule_rewards(r) -> None:
  """The rule verifiers' part of `reward.*` (rewards/config.py checks the models)."""
  check_range("reward.timeout_s", r.timeout_s, low=0, low_open=True)
  check_range("reward.workers", r.workers, low=1)
  check_range("reward.sandbox.timeout_s", r.sandbox.timeout_s, low=0, low_open=True)
  check_range("reward.sandbox.workers", r.sandbox.workers, low=0, note="(0: 4 per core)")
  check_range("reward.sandbox.memory_mb", r.sandbox.memory_mb, low=64)
  one_of("reward.sandbox.isolation", r.sandbox.isolation, ISOLATIONS)
  note = memory_bound_note(r.sandbox.memory_mb)
  if note:
    logging.warning("%s", note)
  extractor = r.math_extractor
  if not extractor.startswith("re:"):
    if extractor not in MATH_EXTRACTORS:
      invalid("reward.math_extractor", extractor, f"must be one of "
              f"{', '.join(MATH_EXTRACTORS)} or 're:<regex with one group>'")
    return
  try:
    groups = re.compile(extractor[3:]).groups
  except re.error as error:
    invalid("reward.math_extractor", extractor, f"is not a valid regex ({error})")
  if groups < 1:
    invalid("reward.math_extractor", extractor, "must have a group (the answer)")
