"""rlhf_jax.models.moe: mixture-of-experts layers.

- `routing`: the router's softmax and top-k (or a replayed choice of experts), the gate
  weights, and the auxiliary losses and load figures;
- `experts`: the experts' gated MLPs over the routed tokens as grouped GEMMs, dropless
  (`jax.lax.ragged_dot` over tokens sorted by expert), or every expert on every token
  ("dense", the reference for small models).
"""

from rlhf_jax.models.moe.experts import EXPERT_KERNELS
from rlhf_jax.models.moe.experts import expert_mlp
from rlhf_jax.models.moe.routing import NOT_RECORDED
from rlhf_jax.models.moe.routing import RouterRecord
from rlhf_jax.models.moe.routing import Routes
from rlhf_jax.models.moe.routing import expert_load
from rlhf_jax.models.moe.routing import layer_record
from rlhf_jax.models.moe.routing import load_balancing_loss
from rlhf_jax.models.moe.routing import record_losses
from rlhf_jax.models.moe.routing import route
from rlhf_jax.models.moe.routing import route_dtype
from rlhf_jax.models.moe.routing import route_flip_rate
from rlhf_jax.models.moe.routing import router_z_loss

__all__ = ["EXPERT_KERNELS", "NOT_RECORDED", "RouterRecord", "Routes", "expert_load",
           "expert_mlp", "layer_record", "load_balancing_loss", "record_losses", "route",
           "route_dtype", "route_flip_rate", "router_z_loss"]
