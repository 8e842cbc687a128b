"""PPO with a process reward model (Dai et al., arXiv:2410.17621; Gao et al.,
arXiv:2410.15115; docs/formulas.md#prm-ppo, #reward-shaping): the PRM's line scores are dense
rewards at line ends, refined by Delta so their sum cannot be farmed, plus the verifier's outcome
at the last token; the critic starts as the PRM.

  python launch/train_prm.py --policy=runs/prm/sft --output=runs/prm/prm
  python launch/train.py --config=configs/prm_ppo.py:arith --workdir=runs/prm \
      --config.reward.process.checkpoint=runs/prm/prm --config.critic.init_from=runs/prm/prm

`--config.algorithm.process_reward.shaping=clip` (η: `.eta`), `clip_delta` or `none`.
"""

from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """PPO + PRM dense rewards on the `arith` task or an `hf` checkpoint."""
  c = sibling_preset(__file__, "ppo", base)
  c.algorithm.name = "prm_ppo"
  c.algorithm.process_reward.shaping = "delta"  # Gao et al.: bounded return.
  c.algorithm.process_reward.coef = 1.0
  return c
