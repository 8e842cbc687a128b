"""LoRA adapters (rlhf_jax/models/lora.py); their PEFT files are tested in
tests/models/hf/test_peft.py.

Expected values come from NumPy written here from the definitions
(W_eff = W + (alpha/r)·A@B on the 2-D view of W; dL/dA = scale·G·Bᵀ,
dL/dB = scale·Aᵀ·G with G = dL/dW_eff).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.models import lora as lora_lib
from rlhf_jax.models.hf import peft as peft_lib
from rlhf_jax.optim import TrainedRole
from tests.models.lora_fixtures import CONFIG
from tests.models.lora_fixtures import D
from tests.models.lora_fixtures import E
from tests.models.lora_fixtures import H
from tests.models.lora_fixtures import LAYERS
from tests.models.lora_fixtures import LORA
from tests.models.lora_fixtures import MODULE
from tests.models.lora_fixtures import SIZES
from tests.models.lora_fixtures import TOKENS
from tests.models.lora_fixtures import V
from tests.models.lora_fixtures import leaves_equal
from tests.models.lora_fixtures import random_adapters


@pytest.fixture(scope="module")
def base():
  return models.init_model(CONFIG, seed=0)


def numpy_merged(params, adapters, scale):
  """W + scale·A@B per kernel, in float64 NumPy, in the kernel's own layout."""
  merged = jax.tree.map(np.asarray, params)
  for i, layer in adapters["layers"].items():
    for module, projections in layer.items():
      for name, ab in projections.items():
        w = np.asarray(params["layers"][i][module][name], np.float64)
        a, b = np.float64(ab["lora_a"]), np.float64(ab["lora_b"])
        if name == "o_proj":    # W [H, D, E]; row h·D + d of the [H·D, E] view
          delta = np.einsum("hdr,re->hde", a.reshape(H, D, -1), b)
        elif name in ("q_proj", "k_proj", "v_proj"):  # W [E, N, D]; column n·D + d
          delta = np.einsum("er,rnd->end", a, b.reshape(b.shape[0], -1, D))
        else:
          delta = a @ b
        merged["layers"][i][module][name] = (w + scale * delta).astype(np.float32)
  return merged


# ----------------------------------------------------------------------------- config


def test_config_validates_and_scales():
  assert lora_lib.LoraConfig(rank=8, alpha=16.0).scale == 2.0
  with pytest.raises(ValueError, match="'fc1'"):
    lora_lib.LoraConfig(targets=("q_proj", "fc1"))
  with pytest.raises(ValueError, match="rank"):
    lora_lib.LoraConfig(rank=0)
  with pytest.raises(ValueError, match="repeats"):
    lora_lib.LoraConfig(targets=("q_proj", "q_proj"))


# ----------------------------------------------------------------------------- merge


def test_merge_equals_numpy_formula(base):
  _, params = base
  adapters = random_adapters()
  merged = jax.jit(lambda p, a: lora_lib.merge(p, a, LORA))(params, adapters)
  expected = numpy_merged(params, adapters, scale=8.0 / 4)
  for got, want in zip(jax.tree.leaves(merged), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
  # Untargeted arrays are passed through untouched (the base's own arrays).
  eager = lora_lib.merge(params, adapters, LORA)
  assert eager["embed"] is params["embed"]
  assert eager["layers"][0]["input_norm"]["weight"] is params["layers"][0]["input_norm"]["weight"]


def test_only_targeted_kernels_change(base):
  _, params = base
  lora = lora_lib.LoraConfig(rank=2, alpha=2.0, targets=("v_proj", "down_proj"))
  adapters = random_adapters(rank=2, targets=("v_proj", "down_proj"))
  merged = lora_lib.merge(params, adapters, lora)
  for i in range(LAYERS):
    for name in SIZES:
      same = np.array_equal(merged["layers"][i][MODULE[name]][name],
                            params["layers"][i][MODULE[name]][name])
      assert same == (name not in ("v_proj", "down_proj")), name


def test_init_starts_at_the_base_model(base):
  model, params = base
  adapters = lora_lib.init_adapters(CONFIG, params, LORA, seed=3)
  for name, (fan_in, fan_out) in SIZES.items():
    ab = adapters["layers"][1][MODULE[name]][name]
    assert ab["lora_a"].shape == (fan_in, 4) and ab["lora_b"].shape == (4, fan_out)
    assert ab["lora_a"].dtype == jnp.float32 and ab["lora_b"].dtype == jnp.float32
    assert not np.any(ab["lora_b"]) and np.std(ab["lora_a"]) > 0
    assert np.max(np.abs(ab["lora_a"])) <= 1 / np.sqrt(fan_in)  # U(±1/√in), PEFT's bound
  lora_model = lora_lib.LoraModel(model, LORA)
  ours, _ = jax.jit(lora_model.apply)({"adapters": adapters, "base": params}, TOKENS)
  want, _ = jax.jit(model.apply)(params, TOKENS)
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_lora_model_runs_the_merged_weights(base):
  model, params = base
  adapters = random_adapters()
  lora_model = lora_lib.LoraModel(model, LORA)
  assert lora_model.config is CONFIG and lora_model.head == "lm"
  ours, _ = jax.jit(lora_model.apply)({"adapters": adapters, "base": params}, TOKENS)
  want, _ = jax.jit(model.apply)(numpy_merged(params, adapters, 2.0), TOKENS)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_stacked_layer_axis_is_handled_generically(base):
  """A [L, ...] stacked layout (scan over layers) gets [L, in, r] / [L, r, out] adapters
  and merges layer by layer exactly as the per-layer dict does."""
  model, params = base
  stacked = dict(params, layers=jax.tree.map(lambda *x: jnp.stack(x),
                                             *[params["layers"][i] for i in range(LAYERS)]))
  adapters = random_adapters()
  stacked_adapters = {"layers": jax.tree.map(lambda *x: np.stack(x),
                                             *[adapters["layers"][i] for i in range(LAYERS)])}
  shapes = jax.eval_shape(lambda p: lora_lib.init_adapters(CONFIG, p, LORA),
                          stacked)["layers"]["attention"]["o_proj"]
  assert shapes["lora_a"].shape == (LAYERS, H * D, 4)
  assert shapes["lora_b"].shape == (LAYERS, 4, E)
  merge = jax.jit(lambda p, a: lora_lib.merge(p, a, LORA))
  merged, per_layer = merge(stacked, stacked_adapters), merge(params, adapters)
  for i in range(LAYERS):
    assert leaves_equal(jax.tree.map(lambda x: x[i], merged["layers"]), per_layer["layers"][i])
  # PEFT export unstacks to the same per-layer tensors.
  ours = peft_lib.peft_tensors(model, stacked_adapters)
  want = peft_lib.peft_tensors(model, adapters)
  assert ours.keys() == want.keys() and all(np.array_equal(ours[k], want[k]) for k in want)


# ----------------------------------------------------------------------------- training


def loss_of(logits):
  weights = jnp.asarray(np.random.default_rng(7).normal(size=(2, 7, V)), jnp.float32)
  return jnp.sum(logits * weights) / 100


def test_adapter_gradient_matches_the_chain_rule(base):
  model, params = base
  adapters = jax.tree.map(jnp.asarray, random_adapters())
  lora_model = lora_lib.LoraModel(model, LORA)
  loss = jax.jit(lambda a: loss_of(lora_model.apply({"adapters": a, "base": params},
                                                    TOKENS)[0]))
  grads = jax.jit(jax.grad(loss))(adapters)
  assert jax.tree.structure(grads) == jax.tree.structure(adapters)  # adapter leaves only
  # G = dL/dW_eff from the plain model at the merged weights, then the chain rule.
  g_full = jax.jit(jax.grad(lambda p: loss_of(model.apply(p, TOKENS)[0])))(
      numpy_merged(params, adapters, 2.0))
  for i in range(LAYERS):
    for name, (fan_in, fan_out) in SIZES.items():
      g = np.asarray(g_full["layers"][i][MODULE[name]][name]).reshape(fan_in, fan_out)
      a = np.asarray(adapters["layers"][i][MODULE[name]][name]["lora_a"])
      b = np.asarray(adapters["layers"][i][MODULE[name]][name]["lora_b"])
      got = grads["layers"][i][MODULE[name]][name]
      np.testing.assert_allclose(got["lora_a"], 2.0 * g @ b.T, rtol=2e-4, atol=1e-6)
      np.testing.assert_allclose(got["lora_b"], 2.0 * a.T @ g, rtol=2e-4, atol=1e-6)
  # And a central finite difference along a random direction.
  rng = np.random.default_rng(5)
  direction = jax.tree.map(lambda x: rng.normal(0, 0.05, x.shape).astype(np.float32),
                           adapters)
  eps = 1e-2
  step = lambda s: jax.tree.map(lambda x, d: x + s * eps * d, adapters, direction)
  numeric = (loss(step(1.0)) - loss(step(-1.0))) / (2 * eps)
  analytic = sum(np.vdot(g, d) for g, d in zip(jax.tree.leaves(grads),
                                                 jax.tree.leaves(direction)))
  np.testing.assert_allclose(numeric, analytic, rtol=1e-2)


def test_optimizer_step_moves_only_the_adapters(base):
  model, params = base
  lora_model = lora_lib.LoraModel(model, LORA)
  tree = {"adapters": jax.tree.map(jnp.asarray, random_adapters()), "base": params}
  optimizer = lora_lib.adapter_optimizer(optax.sgd(0.1))
  state = optimizer.init(tree)
  grads = jax.jit(jax.grad(lambda t: loss_of(lora_model.apply(t, TOKENS)[0])))(tree)
  assert not any(np.any(g) for g in jax.tree.leaves(grads["base"]))  # stopped at the base
  updates, _ = optimizer.update(grads, state, tree)
  new = optax.apply_updates(tree, updates)
  assert leaves_equal(new["base"], params)
  for old, g, now in zip(jax.tree.leaves(tree["adapters"]), jax.tree.leaves(grads["adapters"]),
                         jax.tree.leaves(new["adapters"]), strict=True):
    np.testing.assert_allclose(now, old - 0.1 * g, rtol=1e-6, atol=1e-7)
  # Adam holds moments for the adapters only: 2 × adapter size (+ the step count).
  adam_state = lora_lib.adapter_optimizer(optax.adam(1e-3)).init(tree)
  size = sum(x.size for x in jax.tree.leaves(tree["adapters"]))
  assert sum(x.size for x in jax.tree.leaves(adam_state)) == 2 * size + 1


def test_trained_role_updates_adapters_and_keeps_the_base(base):
  model, params = base
  lora_model = lora_lib.LoraModel(model, LORA)
  mesh = parallel.make_mesh(data=1, devices=jax.devices()[:1])
  tree = lora_model.init_params(jax.tree.map(jnp.copy, params), seed=2)
  shardings = parallel.param_shardings(
      tree, lora_model.logical_axes(), mesh, lora_lib.rules_with_lora(parallel.TRAIN_RULES))
  tree = parallel.shard_params(tree, shardings)
  before = jax.tree.map(np.asarray, tree)

  def loss_fn(p, batch, norm):
    return loss_of(lora_model.apply(p, batch["tokens"])[0]), {}

  role = TrainedRole(lora_model, tree, lora_lib.adapter_optimizer(optax.adam(1e-2)), mesh,
                     loss_fn=loss_fn, normalizer_fn=lambda b: None,
                     has_target=lambda b: jnp.bool_(True), epochs=1, minibatches=1,
                     micro_batches=2)
  role.update({"tokens": TOKENS}, jax.random.key(0))
  assert leaves_equal(role.params["base"], before["base"])
  b_moved = [np.any(np.asarray(role.params["adapters"]["layers"][0]["mlp"][n]["lora_b"]))
             for n in ("gate_proj", "up_proj", "down_proj")]
  assert all(b_moved)


def test_sizes_from_shapes():
  per_layer = sum(4 * (fan_in + fan_out) for fan_in, fan_out in SIZES.values())
  sizes = lora_lib.lora_sizes(CONFIG, LORA)
  targets = LAYERS * sum(fan_in * fan_out for fan_in, fan_out in SIZES.values())
  assert sizes == {"model": CONFIG.num_params(), "targets": targets,
                   "adapters": LAYERS * per_layer}
  pushed = lora_lib.sampler_update_bytes(CONFIG, LORA)
  assert pushed == {"merged_full": 2 * CONFIG.num_params(), "merged_targets": 2 * targets,
                    "adapters": 4 * LAYERS * per_layer}
  assert lora_lib.adapter_bytes(random_adapters()) == 4 * LAYERS * per_layer
