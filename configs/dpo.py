"""DPO (Rafailov et al., arXiv:2305.18290; docs/formulas.md#dpo) on offline pairs.

  python launch/train.py --config=configs/dpo.py:arith --workdir=/tmp/dpo
  python launch/train.py --config=configs/dpo.py:hf --config.model.checkpoint=DIR \
      --config.data.offline_file=pairs.jsonl --workdir=DIR

The data (`data.offline_file`) is pairs (prompt, chosen, rejected) or labelled samples
(launch/label_samples.py), reduced to their best and worst response per prompt; for
arith it is labelled samples of the warm start, written first. IPO is
`--config.algorithm.dpo.kind=ipo`, SLiC `kind=hinge`, cDPO `label_smoothing=0.1`;
iterative DPO on our own samples is configs/iterative_dpo.py.
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """DPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "dpo"
  c.train.packing = False  # the DPO / DQO learners run padded forwards
  a.learner = "dpo"
  a.dpo.beta = 0.1  # β (TRL default).
  a.dpo.kind = "sigmoid"  # −log σ(β·z) (Eq. 7).
  a.dpo.reference = "cached"  # π_ref's log-probs computed once (TRL precompute_ref_log_probs).
  c.rollout.mode = "offline"  # Pairs from data.offline_file.
  c.rollout.group_size = 2  # Chosen, rejected.
  c.rollout.prompts_per_step = 32 if base == "arith" else 64  # Pairs per step.
  c.train.minibatches = 1  # One optimizer step per batch of pairs.
  if base == "arith":
    c.optimizer.learning_rate = 3e-5  # 1e-4 peaks early, then collapses (docs/offline_methods.md).
  else:
    c.optimizer.learning_rate = 1e-6  # TRL default (5e-7 .. 1e-6 in the papers).
  return c
