"""models/moe/parallel.py on one device: without a mesh, or with an expert axis of 1, a
sparse layer computes `expert_mlp` itself (no exchange traced); the exchange on a one-device
mesh against a loop written from the formula; experts that do not split over the expert
axis are refused naming both sizes. The exchange between 8 devices (2 data × 4 expert, and
with fsdp and tensor), values and gradients, is tests/multidevice/test_expert_parallel.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import parallel
from rlhf_jax.models import moe
from rlhf_jax.models.moe.parallel import expert_axis_size
from rlhf_jax.models.moe.parallel import expert_parallel_mlp
from rlhf_jax.models.moe.parallel import experts_on_mesh

N, E, F, X, K = 5, 4, 3, 4, 2


def _layer(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((N, E)).astype(np.float32)
  experts = np.stack([rng.choice(X, K, replace=False) for _ in range(N)]).astype(np.int32)
  weights = rng.uniform(0.1, 1, (N, K)).astype(np.float32)
  gate, up = (rng.standard_normal((X, E, F)).astype(np.float32) for _ in range(2))
  down = rng.standard_normal((X, F, E)).astype(np.float32)
  return x, moe.Routes(jnp.asarray(experts), jnp.asarray(weights)), gate, up, down


def _formula(x, routes, gate, up, down):
  """out[n] = Σ_j w[n, j] · down_e (silu(x[n] @ gate_e) · (x[n] @ up_e))."""
  out = np.zeros((N, E))
  for n in range(N):
    for e, w in zip(np.asarray(routes.experts[n]), np.asarray(routes.weights[n])):
      g, u = x[n] @ gate[e], x[n] @ up[e]
      out[n] += w * ((g / (1 + np.exp(-g)) * u) @ down[e])
  return out


def test_without_an_expert_axis_a_layer_computes_expert_mlp_itself():
  layer = _layer()
  expected = moe.expert_mlp(*layer, kernel="dense")
  mesh = parallel.make_mesh(data=1, devices=jax.devices()[:1])
  assert expert_axis_size(mesh) == 1 and expert_axis_size(None) == 1
  for context in (None, mesh):
    run = jax.jit(lambda *a: experts_on_mesh(*a, kernel="dense"))
    if context is None:
      program, got = str(jax.make_jaxpr(run)(*layer)), run(*layer)
    else:
      with jax.set_mesh(context):
        program, got = str(jax.make_jaxpr(run)(*layer)), run(*layer)
    assert "shard_map" not in program
    np.testing.assert_array_equal(got, expected)


def test_the_exchange_on_one_device_is_the_formula():
  layer = _layer(1)
  mesh = parallel.make_mesh(data=1, devices=jax.devices()[:1])
  got = jax.jit(lambda *a: expert_parallel_mlp(*a, mesh=mesh, kernel="ragged_dot",
                                               precision=jax.lax.Precision.HIGHEST))(*layer)
  np.testing.assert_allclose(got, _formula(*layer), atol=1e-5)


def test_experts_that_do_not_split_over_the_expert_axis_are_refused():
  mesh = jax.sharding.AbstractMesh((2, 3), ("data", "expert"))
  with pytest.raises(ValueError, match="4 experts do not split over the mesh's expert axis "
                     "of 3"):
    expert_parallel_mlp(*_layer(), mesh=mesh)
