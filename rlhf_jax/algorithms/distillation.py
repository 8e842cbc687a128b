"""On-policy distillation: a student trained on a teacher's per-token log-probs over the
student's own samples (Agarwal et al., GKD, arXiv:2306.13649; Lu & Thinking Machines,
"On-Policy Distillation", 2025), added to the PPO family as an advantage estimator.

The student samples a response y; per token the advantage is the negative reverse KL
estimate

    A_t = log π_teacher(y_t | y_<t) − log π_θ(y_t | y_<t)          (+ c · A_task_t)

with π_θ the batch's `old_logprobs` (the student's own, from `ppo_family.prepare`) and
π_teacher its `ref_logprobs`: the teacher is held as the learner's frozen reference role,
loaded from `algorithm.distill.teacher` (a checkpoint that shares the student's tokenizer,
of any size). Maximising Σ_t A_t · log π_θ(y_t) with the surrogate of `policy_loss.kind`
lowers KL(π_θ ‖ π_teacher) on the states the student itself visits. With
`algorithm.distill.task_coef` c > 0 the advantages of `algorithm.distill.task_estimator`
(e.g. GRPO's from the verifier's reward) are added.

The estimator is registered as "distill" (`estimators.register_estimator`,
needs_reference=True): `algorithm.advantage.estimator = "distill"` and nothing in the loop
changes. With `rollout.reference_logprobs='sampler'` the sampling servers hold the teacher
instead and bring its log-probs with the batch (`sampler_reference_params`; a teacher of
the student's architecture only, since a server scores with the model it serves).
docs/distillation.md has the preset, the run and both routes.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms import estimators
from rlhf_jax.batch import TrainBatch
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.models.config import model_layout
from rlhf_jax.models.config import model_numerics
from rlhf_jax.models.functional import RUNTIME_FIELDS
from rlhf_jax.models.hf import checks as checkpoint_checks

NAME = "distill"
SECTION = "distill"
TASK_FIELD = "algorithm.distill.task_estimator"
TEACHER_FIELD = "algorithm.distill.teacher"


def distill_config() -> ml_collections.ConfigDict:
  """The `algorithm.distill` section with its defaults (one comment per field)."""
  d = ml_collections.ConfigDict()
  # HF directory of the teacher (same tokenizer as the policy): the frozen reference is
  # loaded from it instead of copied from the initial policy, by the learner (any size) or,
  # with rollout.reference_logprobs='sampler', by the sampling servers (the policy's
  # architecture). Empty: the reference is the initial policy (a KL term's usual one).
  d.teacher = ""
  # c: weight of the task reward's advantages beside the teacher's per-token term
  # (0 = pure distillation).
  d.task_coef = 0.0
  # The estimator of the task term (a group-based one needs rollout.group_size >= 2).
  d.task_estimator = "grpo"
  return d


def distill_advantages(batch: TrainBatch, token_rewards: jax.Array, algorithm, *,
                       group_size: int) -> tuple[jax.Array, None]:
  """[B, R] A_t = log π_teacher(y_t) − log π_θ(y_t) (+ task_coef · the task estimator's
  advantages), 0 off the response mask; no returns (no critic).

  `batch.ref_logprobs` holds the teacher's log-probs of the sampled tokens and
  `batch.old_logprobs` the student's (π_old), both [B, R]; `token_rewards` and
  `group_size` reach the task estimator only."""
  mask = batch.response_mask
  advantages = (batch.ref_logprobs - batch.old_logprobs) * mask
  section = algorithm[SECTION]
  if section.task_coef > 0:
    task = estimators.estimator(section.task_estimator, TASK_FIELD)
    task_advantages, _ = task.fn(batch, token_rewards, algorithm, group_size=group_size)
    advantages = advantages + section.task_coef * task_advantages * mask
  return advantages, None


DISTILL = estimators.register_estimator(NAME, distill_advantages, needs_reference=True,
                                       token_advantages=True)


def is_distilling(algorithm) -> bool:
  """Whether `algorithm.advantage.estimator` is this module's, under its registered name
  or as "package.module:name" naming the record or the function."""
  return estimators.estimator(algorithm.advantage.estimator).fn is distill_advantages


def is_pure_distillation(algorithm) -> bool:
  """Whether the run distils with no task term (`algorithm.distill.task_coef` = 0): its
  signal, the teacher's per-token term, is dense in every group."""
  return (is_distilling(algorithm) and SECTION in algorithm
          and algorithm[SECTION].task_coef == 0)


def check_distill_fields(section: ml_collections.ConfigDict) -> None:
  """`algorithm.distill.*` alone: the task term's weight and estimator (one that needs
  neither a critic nor a reference: the task term reads the verifier's scores)."""
  check_range("algorithm.distill.task_coef", section.task_coef, low=0,
              note="(0: the teacher's term alone)")
  if section.task_coef > 0:
    if section.task_estimator == NAME:
      invalid("algorithm.distill.task_estimator", section.task_estimator,
              "must be a task-reward estimator, not the teacher's term itself")
    task = estimators.estimator(section.task_estimator, TASK_FIELD)
    if task.needs_critic or task.needs_reference:
      invalid("algorithm.distill.task_estimator", section.task_estimator, "must need "
              "neither a critic nor a reference (e.g. grpo, rloo, reinforce_pp_baseline)")


def validate_distill(c) -> None:
  """The teacher's rules on the whole config (ConfigError naming the field): the
  distill estimator needs `algorithm.distill.teacher`; a teacher never moves (no
  reference EMA); a group-based task term needs groups. Held by the sampling servers
  (`rollout.reference_logprobs='sampler'`) its architecture must be the policy's, which is
  checked once the policy is loaded (`sampler_reference_params`)."""
  a = c.algorithm
  if SECTION not in a:
    if is_distilling(a):
      invalid("algorithm.distill", None, "missing: the distill estimator reads its section "
              "(configs/distill.py builds it)")
    return
  d = a[SECTION]
  check_distill_fields(d)
  if is_distilling(a) and not d.teacher:
    invalid(TEACHER_FIELD, d.teacher, "a teacher checkpoint directory is required for "
            f"algorithm.advantage.estimator={NAME!r}")
  if is_distilling(a) and d.task_coef > 0:
    if estimators.estimator(d.task_estimator).group_based and c.rollout.group_size < 2:
      invalid("rollout.group_size", c.rollout.group_size, "must be >= 2 for algorithm."
              f"distill.task_estimator={d.task_estimator!r} (a baseline from the group)")
  if not d.teacher:
    return
  if a.kl.placement == "none" and not estimators.estimator(a.advantage.estimator
                                                           ).needs_reference:
    invalid(TEACHER_FIELD, d.teacher, "nothing reads the teacher: set algorithm.advantage."
            f"estimator={NAME!r} or a KL term (algorithm.kl.placement)")
  if a.kl.reference_ema:
    invalid("algorithm.kl.reference_ema", a.kl.reference_ema, "must be 0 with a teacher "
            f"({TEACHER_FIELD}): the teacher stays frozen")


def teacher_checkpoint(c) -> str:
  """`algorithm.distill.teacher`, or '' (none, or no such section)."""
  return c.algorithm[SECTION].teacher if SECTION in c.algorithm else ""


def load_teacher(c, policy_model, mesh) -> tuple[object, dict]:
  """(teacher model, params on `mesh`) from `algorithm.distill.teacher`, computing with
  the trainer's numerics (`model.*`), scoring over the vocabulary it shares with the policy.

  Teacher and student share a tokenizer, not necessarily a padded embedding size
  (Qwen2.5-7B's 152064 rows against 1.5B's 151936, both for a 151665-token tokenizer).
  The teacher's rows past the student's vocabulary V_s are ids the tokenizer never
  produces and the student never samples, so its LM head is cut to V_s (`shared_vocabulary`):
  log π_teacher(y_t) is renormalised over the common ids, the support of the reverse
  KL(π_θ ‖ π_teacher) the estimator estimates. With `model.checkpoint` set the two
  tokenizers must be equal (`check_same_tokenizer`); without (the arith warm start), the
  teacher's tokenizer must fit the policy's vocabulary. Raises ConfigError naming
  algorithm.distill.teacher."""
  directory = teacher_checkpoint(c)
  where = f"config.{TEACHER_FIELD}"
  checkpoint_checks.check_checkpoint_dir(directory, where)
  if c.model.checkpoint:
    check_same_tokenizer(directory, c.model.checkpoint, where)
  vocab = policy_model.config.vocab_size
  ids = tokenizer_ids(directory, where)
  if ids > vocab:
    raise ConfigError(f"{where}: {directory}: its tokenizer has ids up to {ids - 1}, past the "
                      f"policy's vocabulary of {vocab} rows: it is not the policy's tokenizer "
                      "(the teacher must share it)", field=TEACHER_FIELD)
  model, params = models.load_hf_checkpoint(directory, **model_layout(c.model))
  model, params = shared_vocabulary(model, params, vocab, f"{where}: {directory}")
  model = models.with_numerics(model, **model_numerics(c.model))
  params = parallel.shard_params(params, parallel.param_shardings(
      params, model.logical_axes(), mesh))
  return model, params


def check_teacher(c, policy_dir: str) -> None:
  """The teacher's files against the policy checkpoint in `policy_dir`, before any weight
  loads (`training/inputs.check_data`, so --validate_only sees them): a checkpoint that
  loads (`checkpoint_checks.check_checkpoint_dir`), the policy's tokenizer
  (`check_same_tokenizer`), at least the policy's embedding rows (config.json vocab_size;
  more are cut: `shared_vocabulary`). ConfigError naming algorithm.distill.teacher."""
  directory = teacher_checkpoint(c)
  if not directory:
    return
  where = f"config.{TEACHER_FIELD}"
  checkpoint_checks.check_checkpoint_dir(directory, where)
  check_same_tokenizer(directory, policy_dir, where)
  teacher_rows = models.read_hf_config(directory).vocab_size
  policy_rows = models.read_hf_config(policy_dir).vocab_size
  if teacher_rows < policy_rows:
    raise _fewer_rows(f"{where}: {directory}", teacher_rows, policy_rows)


def _fewer_rows(where: str, teacher_rows: int, policy_rows: int) -> ConfigError:
  return ConfigError(f"{where}: its vocabulary has {teacher_rows} rows, fewer than the "
                     f"policy's {policy_rows}: the policy can sample ids the teacher cannot "
                     "score (a teacher's padded vocabulary may be larger, never smaller)",
                     field=TEACHER_FIELD)


def tokenizer_ids(directory: str, where: str) -> int:
  """1 + the largest id of the tokenizer in `directory` (the ids it can produce); a
  tokenizer that does not load is a ConfigError starting with `where`."""
  try:
    vocab = models.Tokenizer.from_directory(directory).backend.get_vocab()
  except (OSError, ValueError) as error:
    raise ConfigError(f"{where}: {directory}: the tokenizer does not load ({error}); the "
                      "teacher's directory holds the tokenizer it shares with the policy",
                      field=TEACHER_FIELD) from None
  return max(vocab.values()) + 1


def shared_vocabulary(model, params: dict, vocab_size: int, where: str) -> tuple[object, dict]:
  """The teacher (`model`, host `params`) scoring over the student's `vocab_size` ids only:
  embedding rows [V_s, E] and LM head [E, V_s] (tied: the embedding) cut from [V_t, ...],
  so its log-softmax runs over the common ids. A teacher with fewer rows than the student
  is a ConfigError starting with `where`: the student may sample an id (a padding row) the
  teacher has no logit for."""
  teacher_vocab = model.config.vocab_size
  if teacher_vocab < vocab_size:
    raise _fewer_rows(where, teacher_vocab, vocab_size)
  if teacher_vocab == vocab_size:
    return model, params
  params = dict(params, embed=params["embed"][:vocab_size])
  if "lm_head" in params:
    params["lm_head"] = params["lm_head"][:, :vocab_size]
  config = model.config.replace(vocab_size=vocab_size)
  cut = models.init_model(config, head=model.head, abstract=True)[0]
  return dataclasses.replace(cut, source=model.source), params


# DecoderConfig fields that neither shape the parameter tree nor change what a forward
# computes from it: a teacher and a policy differing only here are one architecture.
NOT_ARCHITECTURE = RUNTIME_FIELDS | {"param_dtype", "scan_layers", "max_position_embeddings"}


def architecture_differences(teacher, policy) -> list[str]:
  """'field teacher≠policy' for each architecture field of two `DecoderConfig`s that
  differs (empty: the teacher's weights fit the policy's model)."""
  return [f"{name} {getattr(teacher, name)}≠{getattr(policy, name)}"
          for name in teacher.__dataclass_fields__
          if name not in NOT_ARCHITECTURE and getattr(teacher, name) != getattr(policy, name)]


def sampler_reference_params(c, policy_model, policy_params, mesh):
  """The weights the sampling servers keep as their reference
  (`rollout.reference_logprobs='sampler'`, sent by `reference.send_reference`): the
  teacher's, loaded as `load_teacher` loads the in-process role, when
  `algorithm.distill.teacher` is set; else the initial policy's `policy_params`.

  A server scores with the model it serves (the policy's), so the teacher's config.json
  is compared with the policy's model before any weight is read. Raises ConfigError
  naming algorithm.distill.teacher when the architectures differ."""
  directory = teacher_checkpoint(c)
  if not directory:
    return policy_params
  where = f"config.{TEACHER_FIELD}"
  checkpoint_checks.check_checkpoint_dir(directory, where)
  teacher = models.read_hf_config(directory, **model_layout(c.model))
  if teacher.vocab_size > policy_model.config.vocab_size:  # cut by `shared_vocabulary`
    teacher = teacher.replace(vocab_size=policy_model.config.vocab_size)
  differ = architecture_differences(teacher, policy_model.config)
  if differ:
    raise ConfigError(f"{where}: {directory}: its architecture differs from the policy's "
                      f"({', '.join(differ)}), and with rollout.reference_logprobs='sampler' "
                      "the servers score with the model they serve; the in-process route "
                      "(rollout.reference_logprobs='trainer') takes a teacher of any size",
                      field=TEACHER_FIELD)
  return load_teacher(c, policy_model, mesh)[1]


def check_same_tokenizer(teacher_dir: str, policy_dir: str, where: str) -> None:
  """ConfigError naming `where` unless the two directories' tokenizers are one: the same
  token → id map (added tokens included) and the same special tokens (which added tokens
  are special: decoding and masks skip them). Their models' padded embedding sizes may
  differ (`shared_vocabulary`); so may the eos each config names (a base and an instruct
  model of one tokenizer)."""
  teacher = models.Tokenizer.from_directory(teacher_dir).backend
  policy = models.Tokenizer.from_directory(policy_dir).backend
  teacher_vocab, policy_vocab = teacher.get_vocab(), policy.get_vocab()
  if teacher_vocab != policy_vocab:
    differ = sorted(set(teacher_vocab.items()) ^ set(policy_vocab.items()))[:3]
    raise ConfigError(f"{where}: {teacher_dir}: its tokenizer differs from the policy's "
                      f"({policy_dir}; e.g. {differ}): the teacher must share the tokenizer",
                      field=TEACHER_FIELD)
  special = [{token.content for token in backend.get_added_tokens_decoder().values()
              if token.special} for backend in (teacher, policy)]
  if special[0] != special[1]:
    differ = sorted(special[0] ^ special[1])[:3]
    raise ConfigError(f"{where}: {teacher_dir}: its special tokens differ from the policy's "
                      f"({policy_dir}; e.g. {differ}): the teacher must share the tokenizer",
                      field=TEACHER_FIELD)
