"""A tiny decoder and random LoRA adapters for it, shared by the LoRA tests
(tests/models/test_lora.py) and the PEFT files' (tests/models/hf/test_peft.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import models
from rlhf_jax.models import lora as lora_lib

E, H, K, D, F, V, LAYERS = 32, 4, 2, 8, 48, 96, 2
CONFIG = models.DecoderConfig(vocab_size=V, hidden_size=E, num_layers=LAYERS, num_heads=H,
                              num_kv_heads=K, head_dim=D, intermediate_size=F)
LORA = lora_lib.LoraConfig(rank=4, alpha=8.0)  # scale 2
TOKENS = jnp.asarray((np.arange(2 * 7).reshape(2, 7) * 11 + 3) % V)
# 2-D sizes [in, out] of every projection of CONFIG, written from the shapes.
SIZES = {"q_proj": (E, H * D), "k_proj": (E, K * D), "v_proj": (E, K * D),
         "o_proj": (H * D, E), "gate_proj": (E, F), "up_proj": (E, F), "down_proj": (F, E)}
MODULE = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention",
          "o_proj": "attention", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def random_adapters(rank=4, seed=1, targets=tuple(SIZES)):
  """Nonzero A and B for every target (NumPy), keyed like our parameter tree; A@B·scale
  is of the size of the base weights (std 0.02), so the model stays near-linear in them."""
  rng = np.random.default_rng(seed)
  out = {"layers": {}}
  for i in range(LAYERS):
    layer = out["layers"].setdefault(i, {})
    for name in targets:
      fan_in, fan_out = SIZES[name]
      layer.setdefault(MODULE[name], {})[name] = {
          "lora_a": rng.normal(0, 0.05, (fan_in, rank)).astype(np.float32),
          "lora_b": rng.normal(0, 0.05, (rank, fan_out)).astype(np.float32)}
  return out


def leaves_equal(x, y):
  """Whether two trees hold bitwise equal leaves, in order."""
  return all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True))
