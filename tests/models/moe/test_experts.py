"""models/moe/experts.py: every kernel against a reference written from the formula (a
loop over tokens and their experts), values and gradients; experts left empty and one
expert taking every token; and transformers' own Qwen3-MoE experts."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.moe import Routes
from rlhf_jax.models.moe import expert_mlp
from rlhf_jax.models.moe import route

N, E, F, X, K = 7, 8, 6, 4, 2
KERNELS = ("ragged_dot", "tiled", "pallas", "dense")  # "pallas" in interpret mode on CPU
# The Pallas kernel's gradients are tested in test_pallas_grouped.py; here, in the slow run.
SLOW_PALLAS = tuple(pytest.param(k, marks=pytest.mark.slow) if k == "pallas" else k
                    for k in KERNELS)


def _weights(seed=0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.normal(size=s) / np.sqrt(s[1]), jnp.float32)
               for s in ((N, E), (X, E, F), (X, E, F), (X, F, E)))


def _silu(z):
  return z / (1 + np.exp(-z))


def _reference(x, experts, weights, gate, up, down):
  """out[n] = Σ_j w[n, j] · down_e(silu(x[n] gate_e) * (x[n] up_e)), e = experts[n, j]."""
  x, gate, up, down = (np.asarray(a, np.float64) for a in (x, gate, up, down))
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    for j in range(experts.shape[1]):
      e = int(experts[n, j])
      out[n] += float(weights[n, j]) * ((_silu(x[n] @ gate[e]) * (x[n] @ up[e])) @ down[e])
  return out


def _loop_in_jax(x, routes, gate, up, down):
  """The same loop in jnp (for gradients), independent of the kernels' sorting and einsums."""
  rows = []
  for n in range(x.shape[0]):
    row = 0.0
    for j in range(routes.experts.shape[1]):
      e = routes.experts[n, j]
      row = row + routes.weights[n, j] * ((jax.nn.silu(x[n] @ gate[e]) * (x[n] @ up[e]))
                                          @ down[e])
    rows.append(row)
  return jnp.stack(rows)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", ["top_k", "an_empty_expert", "one_expert_takes_all"])
def test_values_match_the_formula(kernel, case):
  x, gate, up, down = _weights()
  rng = np.random.default_rng(1)
  if case == "top_k":
    routes = route(jnp.asarray(rng.normal(size=(N, X)), jnp.float32), K, normalize=True)
  else:
    experts = (np.array([[0, 1], [3, 0], [1, 3]] * 3)[:N] if case == "an_empty_expert"
               else np.full((N, 1), 2))
    weights = rng.uniform(0.1, 1.0, size=experts.shape)
    routes = Routes(jnp.asarray(experts, jnp.int32), jnp.asarray(weights, jnp.float32))
  got = jax.jit(functools.partial(expert_mlp, kernel=kernel))(x, routes, gate, up, down)
  want = _reference(x, np.asarray(routes.experts), np.asarray(routes.weights), gate, up, down)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kernel", SLOW_PALLAS)
def test_gradients_match_the_loop_for_every_input_and_the_router(kernel):
  x, gate, up, down = _weights(2)
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(N, X)), jnp.float32)
  cotangent = jnp.asarray(np.random.default_rng(4).normal(size=(N, E)), jnp.float32)

  def loss(fn, x, logits, gate, up, down):
    routes = route(logits, K, normalize=True)
    return jnp.sum(fn(x, routes, gate, up, down) * cotangent)

  ours = jax.jit(jax.grad(functools.partial(loss, functools.partial(expert_mlp, kernel=kernel)),
                          argnums=(0, 1, 2, 3, 4)))(x, logits, gate, up, down)
  want = jax.jit(jax.grad(functools.partial(loss, _loop_in_jax), argnums=(0, 1, 2, 3, 4)))(
      x, logits, gate, up, down)
  for name, a, b in zip(("x", "logits", "gate", "up", "down"), ours, want):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=name)
  assert np.abs(np.asarray(ours[1])).sum() > 0  # the router learns through the weights


def test_an_unknown_kernel_is_refused_naming_the_allowed_ones():
  x, gate, up, down = _weights()
  routes = Routes(jnp.zeros((N, 1), jnp.int32), jnp.ones((N, 1)))
  with pytest.raises(ValueError, match="ragged_dot, tiled, pallas, dense"):
    expert_mlp(x, routes, gate, up, down, kernel="megablox")


def test_equal_to_transformers_qwen3_moe_experts():
  torch = pytest.importorskip("torch")
  qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
  from transformers import Qwen3MoeConfig  # pylint: disable=import-outside-toplevel
  config = Qwen3MoeConfig(hidden_size=E, moe_intermediate_size=F, num_experts=X,
                          num_experts_per_tok=K, norm_topk_prob=False)
  torch.manual_seed(0)
  block = qwen3_moe.Qwen3MoeSparseMoeBlock(config)
  for parameter in block.parameters():
    torch.nn.init.normal_(parameter, std=0.5)
  x = torch.randn(1, N, E)
  with torch.no_grad():
    want = block(x)[0].numpy()
  gate_up = block.experts.gate_up_proj.detach().numpy()  # [X, 2F, E]: gate rows, then up
  gate = np.transpose(gate_up[:, :F], (0, 2, 1))
  up = np.transpose(gate_up[:, F:], (0, 2, 1))
  down = np.transpose(block.experts.down_proj.detach().numpy(), (0, 2, 1))  # [X, F, E]
  tokens = x[0].numpy()
  routes = route(jnp.asarray(tokens @ block.gate.weight.detach().numpy().T), K, normalize=False)
  for kernel in KERNELS:
    got = jax.jit(functools.partial(expert_mlp, kernel=kernel))(
        jnp.asarray(tokens), routes, jnp.asarray(gate), jnp.asarray(up), jnp.asarray(down))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=kernel)


def _clamped_swiglu(g, u, alpha=1.702, limit=7.0):
  g = np.minimum(g, limit)
  return g / (1 + np.exp(-alpha * g)) * (np.clip(u, -limit, limit) + 1)


@pytest.mark.parametrize("kernel", KERNELS)
def test_gpt_oss_biased_clamped_experts_match_the_formula(kernel):
  """Weights large enough that the clamps bite (|gate|, |up| beyond 7 for some rows)."""
  x, gate, up, down = (a * 6.0 for a in _weights(5))
  rng = np.random.default_rng(6)
  biases = tuple(jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((X, F), (X, F), (X, E)))
  routes = route(jnp.asarray(rng.normal(size=(N, X)), jnp.float32), K, normalize=True)
  got = expert_mlp(x, routes, gate, up, down, kernel=kernel, activation="clamped_swiglu",
                   biases=biases)
  xs, g_, u_, d_ = (np.asarray(a, np.float64) for a in (x, gate, up, down))
  bg, bu, bd = (np.asarray(b, np.float64) for b in biases)
  want = np.zeros_like(xs)
  clamped = 0
  for n in range(N):
    for j in range(K):
      e = int(routes.experts[n, j])
      g, u = xs[n] @ g_[e] + bg[e], xs[n] @ u_[e] + bu[e]
      clamped += int((g > 7).any() or (np.abs(u) > 7).any())
      want[n] += float(routes.weights[n, j]) * (_clamped_swiglu(g, u) @ d_[e] + bd[e])
  assert clamped > 0
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_equal_to_transformers_gpt_oss_router_and_experts():
  torch = pytest.importorskip("torch")
  gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
  from transformers import GptOssConfig  # pylint: disable=import-outside-toplevel
  config = GptOssConfig(hidden_size=E, intermediate_size=F, num_local_experts=X,
                        num_experts_per_tok=K)
  config._experts_implementation = None  # pylint: disable=protected-access
  torch.manual_seed(1)
  mlp = gpt_oss.GptOssMLP(config)
  for parameter in mlp.parameters():
    torch.nn.init.normal_(parameter, std=2.0)
  x = torch.randn(1, N, E) * 2.0
  with torch.no_grad():
    want = mlp(x)[0][0].numpy()
  tokens = x[0].numpy()
  logits = tokens @ mlp.router.weight.detach().numpy().T + mlp.router.bias.detach().numpy()
  routes = route(jnp.asarray(logits), K, normalize=True)  # softmax over the top-k logits
  gate_up = mlp.experts.gate_up_proj.detach().numpy()  # [X, E, 2F], gate and up interleaved
  bias = mlp.experts.gate_up_proj_bias.detach().numpy()  # [X, 2F]
  got = expert_mlp(jnp.asarray(tokens), routes, jnp.asarray(gate_up[..., ::2]),
                   jnp.asarray(gate_up[..., 1::2]),
                   jnp.asarray(mlp.experts.down_proj.detach().numpy()),
                   activation="clamped_swiglu",
                   biases=(jnp.asarray(bias[:, ::2]), jnp.asarray(bias[:, 1::2]),
                           jnp.asarray(mlp.experts.down_proj_bias.detach().numpy())))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
