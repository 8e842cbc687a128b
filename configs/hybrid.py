"""Hybrid rewards (Shen et al., arXiv:2503.22230 §3; docs/formulas.md#hybrid-rewards): each sample
goes to a rule verifier if its task has one, else to GenRM w/ GT if it has a ground-truth answer,
else to GenRM against its reference response (best-of-N SFT by the BT RM), else to the
BT reward model. GRPO otherwise.

  python launch/train_rm.py --policy=runs/h/sft --output=runs/h/rm
  python launch/train_judge.py --kind=genrm --policy=runs/h/sft --output=runs/h/genrm
  python launch/train.py --config=configs/hybrid.py:arith --workdir=runs/h \
      --config.reward.rm.checkpoint=runs/h/rm --config.reward.genrm.checkpoint=runs/h/genrm

Every route is optional except that one model must be given; per-route share, mean
score, failure rate and (with `reward.monitor`) the true accuracy of model-scored
samples are in the metrics as reward/<route>/... . A single route for every sample:
`--config.reward.route=rm` (or genrm_gt, genrm_reference, pairwise).
"""

from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """GRPO with hybrid reward routing on the `arith` task or an `hf` checkpoint."""
  c = sibling_preset(__file__, "grpo", base)
  c.algorithm.name = "grpo_hybrid"
  c.reward.route = "hybrid"
  c.reward.wrong_score = 0.0  # Rule verdicts 1/0, on the scale of GenRM's P(yes).
  return c
