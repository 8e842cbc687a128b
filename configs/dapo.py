"""DAPO (arXiv:2503.14476): clip-higher, dynamic sampling, token-level loss, overlong shaping.

  python launch/train.py --config=configs/dapo.py:arith --workdir=/tmp/dapo
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """DAPO on the `arith` task or an `hf` checkpoint (paper values, docs/formulas.md#dapo)."""
  c = base_config(base)
  a = c.algorithm
  a.name = "dapo"
  a.advantage.estimator = "grpo"  # Group-normalised advantages (Eq. 9).
  c.rollout.group_size = 8 if base == "arith" else 16  # G (paper: 16).
  a.policy_loss.clip_low = 0.2  # ε_low (§4.1).
  a.policy_loss.clip_high = 0.28  # ε_high, clip-higher (§3.1).
  a.policy_loss.agg = "token-mean"  # Token-level policy-gradient loss (§3.3, Eq. 12).
  a.kl.placement = "none"  # No KL term, no reference model (§2.3).
  # Keep groups whose rewards vary (§3.2; with the ±1 verifier reward, 0 < #correct < G).
  c.rollout.mode = "dynamic"
  c.rollout.dynamic.max_rounds = 10  # verl's max_num_gen_batches.
  # Soft overlong punishment (§3.4, Eq. 13): paper L_cache 4096 of L_max 20480; the hf
  # base keeps that fifth of its response cap (rollout.max_new_tokens).
  a.overlong.penalty = True
  a.overlong.buffer = 16 if base == "arith" else c.rollout.max_new_tokens // 5
  a.overlong.factor = 1.0
  a.overlong.filter = False  # The final recipe keeps truncated samples (verl FAQ).
  c.reward.correct_score, c.reward.wrong_score = 1.0, -1.0  # ±1 (§2.4, Eq. 7).
  if base == "arith":
    # The README's demo: about 3 min of RL on 2 CPU cores after the SFT warm start.
    c.train.steps = 60
    c.train.eval_every = 20
    c.optimizer.schedule = "cosine"  # settles the policy by the end of a short run
  if base == "hf":
    c.optimizer.learning_rate = 1e-6  # Constant after 20 warm-up steps (§4.1).
    c.optimizer.warmup_steps = 20
    c.optimizer.weight_decay = 0.1  # verl DAPO script.
  return c
