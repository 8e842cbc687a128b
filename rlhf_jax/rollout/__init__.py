"""rlhf_jax.rollout: turning prompts into training batches.

One seam, the `Rollout` protocol (base.py: `collect() -> Rollouts`, `set_step`,
`pop_mix`, `state()` / `restore()`), and its modes: plain groups, DAPO's dynamic
sampling (groups with signal; surplus discarded as in verl, or kept for a bounded number
of policy versions), T-PPO's windows (responses in flight across steps), multi-turn
episodes and offline data — each a record in modes.py (`rollout_mode(c)`,
`register_rollout_mode`).
"""

from rlhf_jax.rollout.generation import Group
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.generation import Rollouts
from rlhf_jax.rollout.generation import pack_groups
from rlhf_jax.rollout.groups import DynamicSamplingRollout
from rlhf_jax.rollout.groups import GroupRollout
from rlhf_jax.rollout.groups import NoSignalError
from rlhf_jax.rollout.windows import WindowPool
from rlhf_jax.rollout.windows import WindowRollout

__all__ = ["DynamicSamplingRollout", "Group", "GroupGenerator", "GroupRollout",
           "NoSignalError", "Rollouts", "WindowPool", "WindowRollout", "pack_groups"]
