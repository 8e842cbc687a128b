"""DQO (Liu et al., arXiv:2410.09302; docs/formulas.md#dqo): the LM as a soft Q-function,
trained offline on verifier-labelled samples of the SFT policy.

  python launch/train.py --config=configs/dqo.py:arith --workdir=/tmp/dqo
  python launch/label_samples.py --config=configs/dqo.py:hf --config.model.checkpoint=DIR \
      --output=labelled.jsonl && python launch/train.py --config=configs/dqo.py:hf \
      --config.model.checkpoint=DIR --config.data.offline_file=labelled.jsonl --workdir=DIR

Q_θ = β·log π_θ/π_ref + V_φ; both regress on soft λ-returns with clipped importance
weights (kernels/q_learning.py: our reconstruction, the details are UNVERIFIED).
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """DQO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "dqo"
  c.train.packing = False  # the DPO / DQO learners run padded forwards
  a.learner = "dqo"
  a.dqo.beta = 0.1  # β (a community TRL fork: 0.03).
  a.dqo.lam = 1.0  # λ (the same fork: 1.0).
  a.dqo.trace_clip = 1.0  # c̄.
  a.dqo.reference = "cached"  # π_ref = the SFT policy that sampled the data.
  c.rollout.mode = "offline"  # Labelled samples from data.offline_file.
  c.rollout.group_size = c.data.offline_samples = 8  # Responses per prompt.
  c.rollout.prompts_per_step = 8 if base == "arith" else 64
  c.reward.wrong_score = 0.0  # Labels: 1 right, 0 wrong.
  if base == "arith":  # The RL rate (2e-4) is unstable here (docs/offline_methods.md).
    c.optimizer.learning_rate = 3e-5
    c.optimizer.critic_learning_rate = 3e-4
  if base == "hf":
    c.optimizer.learning_rate = 5e-7  # The fork's policy lr ...
    c.optimizer.critic_learning_rate = 1e-5  # ... and value lr.
  return c
