"""Logical axis names → mesh axes (parallel/sharding.py): each layout's rules table, and an axis
without a rule named (single device: no emulation needed)."""

import pytest
from jax.sharding import PartitionSpec

from rlhf_jax import parallel


def test_rules():
  assert parallel.logical_to_spec(("embed", "mlp"), parallel.TRAIN_RULES) == PartitionSpec(
      "fsdp", "tensor")
  assert parallel.logical_to_spec(("embed", "mlp"), parallel.GENERATE_RULES) == PartitionSpec(
      None, "tensor")
  with pytest.raises(ValueError, match="logical axis 'experts' has no rule"):
    parallel.logical_to_spec(("experts",), parallel.TRAIN_RULES)
