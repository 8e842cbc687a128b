"""On-policy distillation (GKD, arXiv:2306.13649; Thinking Machines' "On-Policy
Distillation", 2025): the student samples, a teacher scores the student's tokens, and the
per-token advantage is log π_teacher − log π_student (docs/distillation.md).

  python benchmarks/distill_arith.py          # warm-starts a teacher and a student, distils
  python launch/train.py --config=configs/distill.py:arith --workdir=runs/distill \
      --config.algorithm.distill.teacher=runs/teacher/sft
  python launch/train.py --config=configs/distill.py:hf --config.model.checkpoint=SMALL \
      --config.algorithm.distill.teacher=LARGE --config.data.train_file=prompts.jsonl \
      --workdir=DIR

The teacher is any checkpoint with the student's tokenizer (a larger one, typically); the
learner holds it as its frozen reference. `--config.algorithm.distill.task_coef=0.5` adds
GRPO's advantages from the verifier's reward (`.task_estimator`) to the teacher's term.
"""

from rlhf_jax.algorithms import distillation
from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """On-policy distillation on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "distill"
  a.advantage.estimator = distillation.NAME  # A_t = log π_teacher(y_t) − log π_θ(y_t)
  a.kl.placement = "none"  # the advantage is the (negative) reverse KL to the teacher
  # Prompts × samples: 4 per prompt, so a GRPO task term (task_coef > 0) has its groups.
  c.rollout.group_size = 4
  c.rollout.prompts_per_step = 16 if base == "arith" else 64
  a.policy_loss.agg = "token-mean"  # the advantage is per token
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2
  c.train.minibatches = 1  # one on-policy step per batch (π_old is the sampler's)
  c.optimizer.learning_rate = 5e-4 if base == "arith" else 1e-6
  return c
