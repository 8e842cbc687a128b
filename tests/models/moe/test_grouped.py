"""models/moe/grouped.py: the tiled grouped matmul against a NumPy loop over the groups
(values and gradients; an empty group, one group taking every row, rows past the groups,
shapes that are not multiples of the tile) and against `jax.lax.ragged_dot`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.moe import grouped
from tests.models.moe.grouped_cases import CASES
from tests.models.moe.grouped_cases import check
from tests.models.moe.grouped_cases import inputs

HIGHEST = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_the_loop_over_groups(case):
  """Tiles of 8 in chunks of 3: 10 tiles, the last chunk padded."""
  check(functools.partial(grouped.grouped_matmul, tile=8, chunk=3, precision=HIGHEST),
        CASES[case])


def test_one_tile_larger_than_every_group_with_the_defaults():
  check(functools.partial(grouped.grouped_matmul, precision=HIGHEST),
        CASES["uneven_with_an_empty_group"])


def test_bfloat16_rows_and_weights_stay_bfloat16():
  check(functools.partial(grouped.grouped_matmul, tile=8), CASES["uneven_with_an_empty_group"],
        dtype=jnp.bfloat16, rtol=5e-2, atol=2e-1)


def test_equal_to_ragged_dot():
  rows, weights, sizes, _ = inputs([5, 0, 12, 9, 11], seed=3)
  args = (jnp.asarray(rows, jnp.float32), jnp.asarray(weights, jnp.float32),
          jnp.asarray(sizes, jnp.int32))
  ours = jax.jit(functools.partial(grouped.grouped_matmul, tile=8, precision=HIGHEST))
  theirs = jax.jit(functools.partial(jax.lax.ragged_dot, precision=HIGHEST))
  np.testing.assert_allclose(ours(*args), theirs(*args), rtol=1e-6, atol=1e-5)


def test_the_tiles_stay_within_the_static_bound_and_hold_one_group_each():
  sizes = np.array([7, 0, 20, 1, 9])
  tile = 8
  layout = grouped.tile_layout(jnp.asarray(sizes), 37, tile)
  tiles = grouped.num_tiles(37, 5, tile)
  assert tiles == 5 + 5 and layout.tile_group.shape == (tiles,)
  want_groups = np.repeat(np.arange(5), -(-sizes // tile))  # ceil(size / T) tiles each
  assert int(layout.used) == len(want_groups) == 7
  np.testing.assert_array_equal(np.asarray(layout.tile_group)[:7], want_groups)
  position = np.asarray(layout.position)
  group_of_row = np.repeat(np.arange(5), sizes)
  np.testing.assert_array_equal(np.asarray(layout.tile_group)[position[:37] // tile],
                                group_of_row)
  assert len(set(position.tolist())) == 37  # no two rows share a slot


def test_mismatched_shapes_are_refused_naming_the_contract():
  with pytest.raises(ValueError, match=r"\[M, K\], \[G, K, N\], \[G\]"):
    grouped.grouped_matmul(jnp.zeros((4, 3)), jnp.zeros((2, 5, 6)), jnp.zeros(2, jnp.int32))
