"""LoRA adapters (rlhf_jax/models/lora.py) and their PEFT files (rlhf_jax/models/hf/peft.py).

Expected values come from NumPy written here from the definitions
(W_eff = W + (alpha/r)·A@B on the 2-D view of W; dL/dA = scale·G·Bᵀ,
dL/dB = scale·Aᵀ·G with G = dL/dW_eff) and from the PEFT naming convention.
"""

import json

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
HF_MODULE = {"attention": "self_attn", "mlp": "mlp"}


@pytest.fixture(scope="module")
def base():
  return models.init_model(CONFIG, seed=0)


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


def leaves_equal(x, y):
  return all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True))


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


# ----------------------------------------------------------------------------- PEFT files


def expected_peft_shapes(rank):
  """PEFT's names and torch-Linear shapes, written from the convention."""
  out = {}
  for i in range(LAYERS):
    for name, (fan_in, fan_out) in SIZES.items():
      stem = f"base_model.model.model.layers.{i}.{HF_MODULE[MODULE[name]]}.{name}"
      out[f"{stem}.lora_A.weight"] = (rank, fan_in)
      out[f"{stem}.lora_B.weight"] = (fan_out, rank)
  return out


def test_peft_round_trip_names_shapes_and_values(base, tmp_path):
  from safetensors.numpy import load_file

  model, _ = base
  adapters = random_adapters()
  peft_lib.save_peft_adapter(str(tmp_path), model, adapters, LORA,
                             base_model_name_or_path="Qwen/Qwen2.5-0.5B")
  config = json.loads((tmp_path / "adapter_config.json").read_text())
  assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == (
      "LORA", "CAUSAL_LM", 4, 8.0)
  assert sorted(config["target_modules"]) == sorted(SIZES)
  assert config["base_model_name_or_path"] == "Qwen/Qwen2.5-0.5B"
  tensors = load_file(str(tmp_path / "adapter_model.safetensors"))
  assert {k: v.shape for k, v in tensors.items()} == expected_peft_shapes(4)
  q = adapters["layers"][1]["attention"]["q_proj"]
  np.testing.assert_array_equal(
      tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"], q["lora_a"].T)
  np.testing.assert_array_equal(
      tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"], q["lora_b"].T)
  lora, loaded = peft_lib.load_peft_adapter(str(tmp_path), model)
  assert lora == LORA
  assert jax.tree.structure(loaded) == jax.tree.structure(adapters)
  assert leaves_equal(loaded, adapters)


def test_peft_critic_head_is_saved_as_score(base, tmp_path):
  model, params = base
  critic, critic_params = models.critic_from_policy(model, params)
  lora = lora_lib.LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"),
                             modules_to_save=("scalar_head", "scalar_bias"))
  adapters = lora_lib.init_adapters(CONFIG, critic_params, lora, seed=1)
  adapters["scalar_head"] = jnp.arange(E, dtype=jnp.float32)
  adapters["scalar_bias"] = jnp.float32(0.5)
  peft_lib.save_peft_adapter(str(tmp_path), critic, adapters, lora)
  config = json.loads((tmp_path / "adapter_config.json").read_text())
  assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]
  tensors = peft_lib.peft_tensors(critic, adapters)
  assert tensors["base_model.model.score.weight"].shape == (1, E)
  assert tensors["base_model.model.score.bias"].shape == (1,)
  loaded_lora, loaded = peft_lib.load_peft_adapter(str(tmp_path), critic)
  assert loaded_lora == lora and leaves_equal(loaded, adapters)
  values, _ = jax.jit(lora_lib.LoraModel(critic, lora).apply)(
      {"adapters": loaded, "base": critic_params}, TOKENS)
  assert values.shape == TOKENS.shape and np.any(np.asarray(values))


def write_adapter(model, directory, config_changes=None, rank=4, drop=None, extra=None):
  from safetensors.numpy import save_file

  lora = lora_lib.LoraConfig(rank=rank, alpha=8.0)
  peft_lib.save_peft_adapter(str(directory), model, random_adapters(rank=rank), lora)
  path = directory / "adapter_config.json"
  path.write_text(json.dumps({**json.loads(path.read_text()), **(config_changes or {})}))
  tensors = peft_lib.peft_tensors(model, random_adapters(rank=rank))
  if drop:
    del tensors[drop]
  tensors.update(extra or {})
  save_file(tensors, str(directory / "adapter_model.safetensors"))


@pytest.mark.parametrize("changes, message", [
    ({"peft_type": "IA3"}, "'IA3'"),
    ({"target_modules": ["q_proj", "fc1"]}, "'fc1'"),
    ({"target_modules": ".*proj"}, "target_modules="),
    ({"use_rslora": True}, "use_rslora"),
    ({"use_dora": True}, "use_dora"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"bias": "all"}, "bias='all'"),
    # A rank mismatch names the tensor: r = 8 in the config, rank-4 tensors in the file.
    ({"r": 8}, r"'base_model\.model\.model\.layers\.\d\.\w+\.\w+\.lora_A\.weight' has shape "
               r"\(4, \d+\); expected \(8, \d+\)"),
])
def test_peft_config_errors_name_the_key(base, tmp_path, changes, message):
  model, _ = base
  write_adapter(model, tmp_path, changes)
  with pytest.raises(ValueError, match=message):
    peft_lib.load_peft_adapter(str(tmp_path), model)


def test_peft_tensor_errors_name_the_tensor(base, tmp_path):
  model, _ = base
  name = "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"
  write_adapter(model, tmp_path / "missing", drop=name)
  with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.k_proj\.lora_B.*missing"):
    peft_lib.load_peft_adapter(str(tmp_path / "missing"), model)
  extra = {"base_model.model.lm_head.lora_A.weight": np.zeros((4, E), np.float32)}
  write_adapter(model, tmp_path / "extra", extra=extra)
  with pytest.raises(ValueError, match=r"unexpected.*lm_head\.lora_A"):
    peft_lib.load_peft_adapter(str(tmp_path / "extra"), model)


def test_peft_loads_our_adapter_onto_transformers(base, tmp_path):
  """Optional: `peft` applies our exported adapter to the HF model of the same weights and
  gives our logits."""
  peft = pytest.importorskip("peft")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model, params = base
  adapters = random_adapters()
  models.save_hf_checkpoint(str(tmp_path / "base"), model, params)
  peft_lib.save_peft_adapter(str(tmp_path / "adapter"), model, adapters, LORA)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path / "base"), torch_dtype=torch.float32)
  hf_model = peft.PeftModel.from_pretrained(hf_model, str(tmp_path / "adapter")).eval()
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.as_tensor(np.array(TOKENS))).logits.numpy()
  ours, _ = jax.jit(lora_lib.LoraModel(model, LORA).apply)(
      {"adapters": adapters, "base": params}, TOKENS)
  plain, _ = jax.jit(model.apply)(params, TOKENS)
  assert np.max(np.abs(np.asarray(ours) - np.asarray(plain))) > 1e-2  # the adapter matters
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-4, atol=1e-4)


def test_we_load_an_adapter_peft_wrote(base, tmp_path):
  """Optional: an adapter trained-and-saved by `peft` (random A and B) loads into ours and
  gives peft's logits."""
  peft = pytest.importorskip("peft")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model, params = base
  models.save_hf_checkpoint(str(tmp_path / "base"), model, params)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path / "base"), torch_dtype=torch.float32)
  torch.manual_seed(0)
  config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj", "up_proj"],
                           init_lora_weights=False, task_type="CAUSAL_LM")
  hf_model = peft.get_peft_model(hf_model, config).eval()
  hf_model.save_pretrained(str(tmp_path / "adapter"))
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.as_tensor(np.array(TOKENS))).logits.numpy()
  lora, adapters = peft_lib.load_peft_adapter(str(tmp_path / "adapter"), model)
  assert lora == lora_lib.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "o_proj", "up_proj"))
  ours, _ = jax.jit(lora_lib.LoraModel(model, lora).apply)(
      {"adapters": adapters, "base": params}, TOKENS)
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-4, atol=1e-4)
