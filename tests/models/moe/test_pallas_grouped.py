"""models/moe/pallas_grouped.py: the Pallas grouped GEMM in interpret mode against the NumPy
loop over the groups and `jax.lax.ragged_dot` (values and gradients; an empty group, one
group taking every row, rows past the groups, shapes that are not multiples of the tiles),
and the experts' kernel choice: "pallas" refused by a CPU-only run's config."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models import config as model_section
from rlhf_jax.models.moe import pallas_grouped
from rlhf_jax.models.moe.experts import resolve_kernel
from tests.models.moe.grouped_cases import CASES
from tests.models.moe.grouped_cases import check
from tests.models.moe.grouped_cases import inputs

HIGHEST = jax.lax.Precision.HIGHEST
# Tiles of 8 rows, 8 columns and K steps of 8: M = 37, N = 19 and K = 20 all cut a tile.
SMALL = dict(block_m=8, block_n=8, block_k=8, interpret=True, precision=HIGHEST)


@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_the_loop_over_groups(case):
  check(functools.partial(pallas_grouped.grouped_matmul, **SMALL), CASES[case])


def test_equal_to_ragged_dot_in_interpret_mode():
  rows, weights, sizes, _ = inputs([5, 0, 12, 9, 11], seed=3)
  args = (jnp.asarray(rows, jnp.float32), jnp.asarray(weights, jnp.float32),
          jnp.asarray(sizes, jnp.int32))
  ours = jax.jit(functools.partial(pallas_grouped.grouped_matmul, **SMALL))
  theirs = jax.jit(functools.partial(jax.lax.ragged_dot, precision=HIGHEST))
  np.testing.assert_allclose(ours(*args), theirs(*args), rtol=1e-6, atol=1e-5)


def test_tiles_that_are_not_powers_of_two_are_refused_by_name():
  rows, weights, sizes, _ = inputs([37, 0, 0, 0, 0])
  with pytest.raises(ValueError, match="block_n=24 must be a power of two"):
    pallas_grouped.grouped_matmul(jnp.asarray(rows), jnp.asarray(weights),
                                  jnp.asarray(sizes), block_n=24, interpret=True)
  with pytest.raises(ValueError, match="block_k=8 must be a power of two ≥ 16 on a GPU"):
    pallas_grouped.grouped_matmul(jnp.asarray(rows), jnp.asarray(weights),
                                  jnp.asarray(sizes), block_k=8, interpret=False)


def test_auto_is_per_backend_and_the_others_are_taken_as_given():
  want = {"gpu": "tiled", "tpu": "ragged_dot", "cpu": "tiled"}[jax.default_backend()]
  assert resolve_kernel("auto") == want
  for kernel in ("ragged_dot", "tiled", "pallas", "dense"):
    assert resolve_kernel(kernel) == kernel


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="a GPU run may choose pallas")
def test_a_cpu_only_run_choosing_pallas_is_refused_naming_the_field():
  m = model_section.model_config()
  m.expert_kernel = "pallas"
  with pytest.raises(ConfigError, match=r"^config\.model\.expert_kernel: invalid value "
                     r"'pallas': the Pallas grouped GEMM needs a GPU \(this run's backend "
                     r"is cpu\)") as error:
    model_section.validate_model_config(m, from_scratch=False)
  assert "\n" not in str(error.value)
  m.expert_kernel = "tiled"
  model_section.validate_model_config(m, from_scratch=False)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the Triton lowering needs a GPU")
@pytest.mark.parametrize("case", CASES)
def test_the_triton_kernel_matches_the_loop_on_a_gpu(case):
  """The default tiles (64 × 64, K steps of 32), compiled by Triton; float32 at HIGHEST."""
  check(functools.partial(pallas_grouped.grouped_matmul, interpret=False, precision=HIGHEST),
        CASES[case])
