"""The one place that reads `reward.*`: the run's training scorer, its evaluation
scorer and the PRM's step ends, from rule verifiers, reward models, judges and the
PRM (rewards/hybrid.py routes between them per sample).

    training_scorer(c, tasks, mesh, prompts) the reward the policy is trained on
    evaluation_scorer(c, scorer, tasks)      held-out accuracy: always the verifiers'
    step_end_ids(c, tokenizer)               where the PRM's step rewards land (or None)
    prefix_value_scorer(directory, c, mesh)  a PRM that scores partial responses

Reward models and the PRM are frozen roles on the trainer mesh, laid out like the
reference (`param_shardings` of the training rules); a judge's weights get the
sampler's layout (GENERATE_RULES) and an in-process engine of their own, or the judge
is a server (`reward.judge_sampler.address`). Nothing goes through the host.
"""

from __future__ import annotations

from typing import Mapping, Sequence


from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import invalid
from rlhf_jax.rewards import config as reward_config_lib
from rlhf_jax.rewards.function_scorer import FunctionScorer
from rlhf_jax.rewards.functions import parse_reward_config
from rlhf_jax.rewards.genrm import GenRMScorer
from rlhf_jax.rewards.hybrid import RoutedScorer
from rlhf_jax.rewards.hybrid import hybrid_chooser
from rlhf_jax.rewards.judge import VerdictJudge
from rlhf_jax.rewards.judge import verdict_token_ids
from rlhf_jax.rewards.pairwise import PairwiseScorer
from rlhf_jax.rewards.prm import ProcessRewardModel
from rlhf_jax.rewards.prm import WithProcessRewards
from rlhf_jax.rewards.prm import step_end_token_ids
from rlhf_jax.rewards.reward_model import RewardModelScorer
from rlhf_jax.rewards.reward_model import ScoringLayout
from rlhf_jax.rewards.router import has_verifier
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.optim import FrozenRole
from rlhf_jax.rewards.prm import PrefixValueScorer
from rlhf_jax.rewards.router import router_for_tasks
from rlhf_jax.sandbox.jobs import SandboxUnavailable
from rlhf_jax.sampling import config as sampler_config_lib


def load_frozen(directory: str, mesh, *, head: str, dtype: str = "float32",
                matmul_precision: str = "auto", rules=None) -> tuple[FrozenRole, object, list[int]]:
  """(role, tokenizer, prompt prefix) of an HF checkpoint, its params on `mesh` in the
  layout of `rules` (default: the training layout, like the reference)."""
  model, params = models.load_hf_checkpoint(directory, head=head)
  model = models.with_numerics(model, dtype=dtype, matmul_precision=matmul_precision)
  shardings = (parallel.param_shardings(params, model.logical_axes(), mesh) if rules is None
               else parallel.param_shardings(params, model.logical_axes(), mesh, rules))
  role = FrozenRole(model, parallel.shard_params(params, shardings))
  tokenizer = models.Tokenizer.from_directory(directory)
  return role, tokenizer, models.load_prompt_prefix(directory, tokenizer)


def scoring_layout(c, tokenizer, prefix: Sequence[int]) -> ScoringLayout:
  """Reward-model inputs of this run: the policy's prompts and responses (+ EOS)."""
  return ScoringLayout(tokenizer=tokenizer, prefix=tuple(prefix),
                       prompt_length=c.data.prompt_length,
                       response_length=c.rollout.max_new_tokens + 1,
                       chat_template=c.data.chat_template,
                       system_prompt=c.data.system_prompt)


def build_judge(c, section, verdicts: Mapping[str, str], mesh) -> VerdictJudge:
  """A VerdictJudge over the checkpoint of `section` (reward.genrm / reward.pairwise)
  in an in-process engine, or over the server at reward.judge_sampler.address;
  `verdicts` maps each verdict's field to its text, in the judge's order."""
  s = c.reward.judge_sampler
  directory = section.checkpoint
  tokenizer = models.Tokenizer.from_directory(directory)
  prefix = models.load_prompt_prefix(directory, tokenizer)
  ids = verdict_token_ids(tokenizer, verdicts)
  if s.address:
    # grpc is the `serve` extra's: imported only when a judge server is configured.
    from rlhf_jax.sampling.remote import connect as remote  # pylint: disable=import-outside-toplevel
    sampler = remote.connect(s, "reward.judge_sampler")  # its token and TLS files
  else:
    role, _, _ = load_frozen(directory, mesh, head="lm", dtype=s.dtype,
                             matmul_precision=s.matmul_precision,
                             rules=parallel.GENERATE_RULES)
    sampler = sampler_config_lib.build_scheduler(s, role.model, role.params,
                                                 tokenizer=tokenizer, seed=c.seed)
  return VerdictJudge(sampler, tokenizer, ids, prefix=prefix,
                      max_prompt_tokens=min(max(s.prompt_buckets), s.cache_length - 1),
                      min_verdict_mass=section.min_verdict_mass)


def build_model_routes(c, mesh) -> dict[str, Scorer]:
  """The model scorers `reward.route` needs (rm, genrm_gt, genrm_reference, pairwise)."""
  r, routes = c.reward, {}
  needed = reward_config_lib.routes_needed(r)
  if "rm" in needed:
    role, tokenizer, prefix = load_frozen(r.rm.checkpoint, mesh, head="scalar",
                                          dtype=c.model.dtype)
    routes["rm"] = RewardModelScorer(role, scoring_layout(c, tokenizer, prefix),
                                     batch_size=r.rm.batch_size,
                                     correct_threshold=r.rm.correct_threshold,
                                     failure_score=r.failure_score, mesh=mesh)
  if any(route.startswith("genrm") for route in needed):
    judge = build_judge(c, r.genrm, {"reward.genrm.yes": r.genrm.yes,
                                     "reward.genrm.no": r.genrm.no}, mesh)
    for route, mode, template in (("genrm_gt", "gt", r.genrm.template_gt),
                                  ("genrm_reference", "reference", r.genrm.template_reference)):
      if route in needed:
        routes[route] = GenRMScorer(judge, mode=mode, template=template,
                                    reference_key=r.genrm.reference_key,
                                    failure_score=r.failure_score)
  if "pairwise" in needed:
    judge = build_judge(c, r.pairwise, {"reward.pairwise.first": r.pairwise.first,
                                        "reward.pairwise.second": r.pairwise.second}, mesh)
    routes["pairwise"] = PairwiseScorer(judge, anchor_key=r.pairwise.anchor_key,
                                        template=r.pairwise.template,
                                        centre=r.pairwise.centre,
                                        failure_score=r.failure_score)
  return routes


def verifiers(c, tasks: Sequence[str]) -> Scorer:
  """The `reward` section's router over the rule verifiers and sandbox the data's `tasks`
  need (`rewards.router.router_for_tasks`); a missing dependency or a sandbox that
  cannot start is a ConfigError here, before anything compiles."""
  r = c.reward
  try:
    return router_for_tasks(
        tasks, correct_score=r.correct_score, wrong_score=r.wrong_score,
        failure_score=r.failure_score, timeout_s=r.timeout_s, workers=r.workers,
        math_extractor=r.math_extractor, sandbox_timeout_s=r.sandbox.timeout_s,
        sandbox_memory_mb=r.sandbox.memory_mb, sandbox_workers=r.sandbox.workers or None,
        sandbox_isolation=r.sandbox.isolation)
  except ImportError as error:
    raise ConfigError(f"the data has a 'math' task: {error}") from None
  except ValueError as error:
    invalid("reward.math_extractor", r.math_extractor, str(error))
  except SandboxUnavailable as error:
    invalid("reward.sandbox.isolation", r.sandbox.isolation, str(error))


def scores_any_task(c) -> bool:
  """Whether the reward scores samples of any task (a reward function or a model route),
  not only the registered tasks' (tasks/registry.py)."""
  return bool(c.reward.function) or c.reward.route != "verifier"


def uses_models(c) -> bool:
  """Whether the reward needs a model (a route other than the verifiers, or a PRM)."""
  return c.reward.route != "verifier" or bool(c.reward.process.checkpoint)


def training_scorer(c, tasks: Sequence[str], mesh, prompts=None) -> Scorer:
  """The run's scorer (`reward.route`): the rule verifiers of `tasks` alone for route
  'verifier' (or `reward.function`'s scorer when set), else a RoutedScorer over the model
  routes (and the verifiers and the function for 'hybrid'), with a monitor of the rule
  verifiers; plus the PRM's step rewards when `reward.process.checkpoint` is set. Models
  load onto `mesh`; `prompts` (the run's PromptFormat) renders the prompts a reward
  function is given."""
  r = c.reward
  verifiable = [t for t in tasks if has_verifier(t)]
  if r.route == "verifier":
    scorer = function_scorer(c, verifiable, prompts) if r.function else verifiers(c, tasks)
  else:
    routes = build_model_routes(c, mesh)
    if r.route == "hybrid" and verifiable:
      routes["verifier"] = verifiers(c, verifiable)
    if r.route == "hybrid" and r.function:
      routes["function"] = function_scorer(c, (), prompts)
    choose = (hybrid_chooser(routes, verifiable, reference_key=r.genrm.reference_key)
              if r.route == "hybrid" else (lambda example, route=r.route: route))
    monitor = verifiers(c, verifiable) if r.monitor and verifiable else None
    scorer = RoutedScorer(routes, choose, monitor=monitor, monitor_tasks=verifiable,
                          failure_score=r.failure_score)
  if r.process.checkpoint:
    role, tokenizer, prefix = load_frozen(r.process.checkpoint, mesh, head="scalar",
                                          dtype=c.model.dtype)
    prm = ProcessRewardModel(role, scoring_layout(c, tokenizer, prefix),
                             step_ends_of(c, tokenizer),
                             batch_size=r.process.batch_size, mesh=mesh)
    scorer = WithProcessRewards(scorer, prm)
  return scorer


def function_scorer(c, monitor_tasks: Sequence[str], prompts) -> Scorer:
  """`reward.function`'s scorer; the rule verifiers of `monitor_tasks` judge correctness
  (the true accuracy) beside it. `prompts`: the run's PromptFormat."""
  if prompts is None:
    raise ValueError("reward.function needs the run's PromptFormat (training_scorer("
                     "..., prompts=policy.prompts)).")
  r = c.reward
  monitor = verifiers(c, monitor_tasks) if monitor_tasks else None
  return FunctionScorer(parse_reward_config(r), render_prompt=prompts.decoded,
                        encode=prompts.tokenizer.encode, monitor=monitor,
                        monitor_tasks=monitor_tasks, failure_score=r.failure_score,
                        unscored=r.unscored, timeout_s=r.function_timeout_s,
                        workers=r.workers, memory_mb=r.worker_memory_mb)


def evaluation_scorer(c, scorer: Scorer, tasks: Sequence[str]) -> Scorer:
  """The scorer of held-out accuracy: the rule verifiers of `tasks` (the true accuracy)
  whenever the training reward is a model or a reward function and every task has a
  verifier, else `scorer` itself."""
  if ((uses_models(c) or c.reward.function) and tasks
      and all(has_verifier(t) for t in tasks)):
    return verifiers(c, tasks)
  return scorer


def step_end_ids(c, tokenizer) -> frozenset[int] | None:
  """The policy's step-end tokens where the PRM's step rewards land, or None without a
  PRM (`reward.process.checkpoint`)."""
  return step_ends_of(c, tokenizer) if c.reward.process.checkpoint else None


def prefix_value_scorer(directory: str, c, mesh) -> Scorer:
  """A PRM checkpoint as a scorer of partial responses (its value at the last token;
  speculative rejection's `--prm`)."""
  role, tokenizer, prefix = load_frozen(directory, mesh, head="scalar", dtype=c.model.dtype)
  return PrefixValueScorer(ProcessRewardModel(
      role, scoring_layout(c, tokenizer, prefix), step_ends_of(c, tokenizer), mesh=mesh))


def step_ends_of(c, tokenizer) -> frozenset[int]:
  """The tokens of `tokenizer` that end a step (`reward.process.step_delimiter`); a
  ConfigError naming the field when none does."""
  try:
    return step_end_token_ids(tokenizer, c.reward.process.step_delimiter)
  except ValueError as error:
    invalid("reward.process.step_delimiter", c.reward.process.step_delimiter, str(error))
