"""rlhf_jax.rollout: turning prompts into training batches.

One interface, `collect() -> Rollouts` with `state()` / `restore()`, and three modes:
plain groups, DAPO's dynamic sampling (a buffer of groups with signal), T-PPO's
windows (responses in flight across steps). See `config.build_rollout`.
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
