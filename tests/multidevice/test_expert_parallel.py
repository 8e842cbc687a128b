"""Expert parallelism (models/moe/parallel.py): the experts split over the `expert` mesh axis,
the tokens exchanged under shard_map. The exchange against a NumPy loop written from the
formula; a tiny Qwen3-MoE's forward and gradient on 2 (data) × 4 (expert) and
2 (fsdp) × 2 (expert) × 2 (tensor) against one device, and across 2 processes; a GRPO step
of a Qwen3-MoE checkpoint on 2 × 4 against one device. (`mesh.expert` against the model:
tests/training/test_build.py, test_inputs.py.)"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.models import moe
from rlhf_jax.models.moe import parallel as moe_parallel
from rlhf_jax.models.moe.parallel import expert_parallel_mlp
from rlhf_jax.training import loop
from tests.launch.byo_files import MESSAGES
from tests.launch.byo_files import TINY
from tests.launch.byo_files import family_checkpoint
from tests.launch.byo_files import trl_file
from tests.multidevice.jobs import start_job
from tests.multidevice.jobs import wait
from tests.training.runs import parse
from tests.training.runs import records

# Every kernel but "pallas" (interpret mode on CPU: minutes under shard_map); the tiled one
# compiles ~15 s.
KERNELS = [pytest.param(kernel, marks=[pytest.mark.slow] if kernel == "tiled" else [])
           for kernel in ("ragged_dot", "dense", "tiled") if kernel in moe.EXPERT_KERNELS]
MESHES = {"data2_expert4": dict(data=2, expert=4),
          "fsdp2_expert2_tensor2": dict(data=1, fsdp=2, expert=2, tensor=2)}


def numpy_experts(x, experts, weights, gate, up, down):
  """out[n] = Σ_j w[n, j] · down_e (silu(x[n] @ gate_e) · (x[n] @ up_e)), e = experts[n, j]."""
  out = np.zeros_like(x, dtype=np.float64)
  for n in range(x.shape[0]):
    for e, w in zip(experts[n], weights[n]):
      g, u = x[n] @ gate[e], x[n] @ up[e]
      out[n] += w * ((g / (1 + np.exp(-g)) * u) @ down[e])
  return out


def random_layer(rng, tokens, num_experts=8, top_k=3, hidden=8, width=6):
  x = rng.standard_normal((tokens, hidden)).astype(np.float32)
  experts = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(tokens)])
  experts[:5] = experts[0]  # several tokens on the same experts; others left empty below
  experts[experts == 6] = 7
  weights = rng.uniform(0.1, 1, (tokens, top_k)).astype(np.float32)
  gate, up = (rng.standard_normal((num_experts, hidden, width)).astype(np.float32) * 0.5
              for _ in range(2))
  down = rng.standard_normal((num_experts, width, hidden)).astype(np.float32) * 0.5
  return x, experts.astype(np.int32), weights, gate, up, down


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", list(MESHES))
def test_exchange_matches_the_formula_and_one_device_gradients(layout, kernel):
  # 36 tokens: not a multiple of the 8 token shards of data2_expert4 (padded rows).
  x, experts, weights, gate, up, down = random_layer(np.random.default_rng(0), 36)
  mesh = parallel.make_mesh(**MESHES[layout])

  def sharded(x, weights, gate, up, down):
    routes = moe.Routes(jnp.asarray(experts), weights)
    return expert_parallel_mlp(x, routes, gate, up, down, mesh=mesh, kernel=kernel,
                               precision=jax.lax.Precision.HIGHEST)

  def single(x, weights, gate, up, down):
    return moe.expert_mlp(x, moe.Routes(jnp.asarray(experts), weights), gate, up, down,
                          kernel=kernel, precision=jax.lax.Precision.HIGHEST)

  got = jax.jit(sharded)(x, weights, gate, up, down)
  np.testing.assert_allclose(got, numpy_experts(x, experts, weights, gate, up, down),
                             atol=1e-5)
  probe = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
  grad = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) * probe), argnums=range(5)))
  for a, b in zip(grad(sharded)(x, weights, gate, up, down),
                  grad(single)(x, weights, gate, up, down)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_biased_experts_with_the_width_over_tensor_match_one_device():
  """gpt-oss's experts: biases on each projection and the clamped SwiGLU; the down bias is
  added once per token although each tensor shard computes a slice of the width."""
  rng = np.random.default_rng(2)
  x, experts, weights, gate, up, down = random_layer(rng, 24)
  biases = tuple(rng.standard_normal(shape).astype(np.float32)
                 for shape in ((8, 6), (8, 6), (8, 8)))
  mesh = parallel.make_mesh(**MESHES["fsdp2_expert2_tensor2"])
  options = dict(activation="clamped_swiglu", swiglu_limit=1.5, kernel="ragged_dot",
                 precision=jax.lax.Precision.HIGHEST)

  def loss(run, x, gate, biases):
    return jnp.sum(run(x, moe.Routes(jnp.asarray(experts), jnp.asarray(weights)), gate, up, down,
                       biases=biases, **options) ** 2)

  sharded = functools.partial(expert_parallel_mlp, mesh=mesh)
  for a, b in zip(jax.jit(jax.value_and_grad(functools.partial(loss, sharded), (0, 1, 2)))(
                      x, gate, biases),
                  jax.jit(jax.value_and_grad(functools.partial(loss, moe.expert_mlp), (0, 1, 2)))(
                      x, gate, biases)):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), a, b)


CONFIG = models.DecoderConfig(
    vocab_size=64, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    intermediate_size=24, architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
    num_experts=8, experts_per_token=2, expert_intermediate_size=8,
    normalize_expert_weights=True, dense_layers=(1,), tie_embeddings=False,
    expert_kernel="ragged_dot")  # the kernels are compared in the exchange test


def nll(model, params, tokens):
  """Mean next-token NLL."""
  logits, _ = model.apply(params, tokens)
  return -jnp.mean(kernels.token_logprobs(logits[:, :-1], tokens[:, 1:]))


def tiny_moe(config=CONFIG):
  """`config`'s model (CONFIG: a sparse layer, then a dense one), its host parameters, and
  tokens [8, 10]."""
  model, params = models.init_model(config, seed=0)
  params = jax.tree.map(np.asarray, params)
  # Larger router weights than the init's 0.02: distinct probabilities, no near-ties.
  layers = params["layers"]
  if config.scan_layers:  # stacked: [L, E, X]
    layers["mlp"]["router"] = layers["mlp"]["router"] * 50
  else:
    layers[0]["mlp"]["router"] = layers[0]["mlp"]["router"] * 50
  return model, params, np.random.default_rng(0).integers(0, 64, (8, 10)).astype(np.int32)


def moe_gradients(mesh) -> dict[str, np.ndarray]:
  """The tiny Qwen3-MoE's loss and gradients on `mesh`, parameters and tokens laid out by
  the rules (host values: every process of a job gets them whole), by parameter path."""
  model, params, tokens = tiny_moe()
  sharded = jax.device_put(params, parallel.param_shardings(params, model.logical_axes(), mesh))
  batch = jax.device_put(tokens, parallel.batch_sharding(mesh))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  with jax.set_mesh(mesh):
    loss, grads = jax.jit(jax.value_and_grad(functools.partial(nll, model)),
                          out_shardings=whole)(sharded, batch)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  return {"loss": np.asarray(loss), **{jax.tree_util.keystr(path): np.asarray(leaf)
                                       for path, leaf in flat}}


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_process_of_eight(tmp_path):
  """An expert axis of 8 over 2 processes × 4 devices (gloo on loopback): the tokens'
  all-gather and the outputs' reduce-scatter cross the processes."""
  expected = moe_gradients(parallel.make_mesh(data=1, expert=8))
  wait(start_job(tmp_path, "moe_gradients", steps=0, mesh=(1, 8)), tmp_path)
  got = np.load(tmp_path / "gradients.npz")
  assert sorted(got.files) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("layout, scan", [("data2_expert4", False),
                                          ("fsdp2_expert2_tensor2", True)])
def test_qwen3_moe_forward_and_gradient_match_one_device(layout, scan):
  """The layers one by one, or stacked in a layer scan with remat (the exchange inside the
  scan's body and its rematerialised backward)."""
  config = (dataclasses.replace(CONFIG, dense_layers=(), scan_layers=True, remat=True)
            if scan else CONFIG)
  model, params, tokens = tiny_moe(config)
  forward = jax.jit(lambda p, t: model.apply(p, t)[0])
  grad = jax.jit(jax.value_and_grad(functools.partial(nll, model)))
  expected_logits = forward(params, tokens)
  expected_loss, expected_grads = grad(params, tokens)

  mesh = parallel.make_mesh(**MESHES[layout])
  shardings = parallel.param_shardings(params, model.logical_axes(), mesh)
  layers = shardings["layers"]
  gate = layers["mlp"]["gate_proj"] if scan else layers[0]["mlp"]["gate_proj"]
  assert gate.spec[1 if scan else 0] == "expert"  # [L, X, E, F] when stacked
  sharded = parallel.shard_params(params, shardings)
  batch = jax.device_put(tokens, parallel.batch_sharding(mesh))
  with jax.set_mesh(mesh):
    program = str(jax.make_jaxpr(grad)(sharded, batch))
    logits = forward(sharded, batch)
    loss, grads = grad(sharded, batch)
  assert "shard_map" in program and "reduce_scatter" in program  # the exchange ran
  np.testing.assert_allclose(logits, expected_logits, atol=1e-5)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads,
               expected_grads)


def moe_run(tmp_path, checkpoint, name, mesh):
  """One GRPO step of the tiny Qwen3-MoE checkpoint on `mesh` (data, expert)."""
  data = trl_file(tmp_path / "colours.jsonl",
                  [{"prompt": MESSAGES, "solution": colour} for colour in ("red", "blue")])
  config = parse("configs/grpo.py:hf", f"--config.model.checkpoint={checkpoint}",
                 f"--config.data.train_file={data}", "--config.data.columns=answer=solution",
                 "--config.data.default_task=colours",
                 "--config.reward.function=tests.rewards.reward_fns:solution_match", *TINY,
                 "--config.rollout.group_size=4", "--config.train.steps=1",
                 "--config.train.eval_every=0", "--config.train.log_rollouts=0",
                 f"--config.mesh.data={mesh[0]}", f"--config.mesh.expert={mesh[1]}")
  trainer = loop.Trainer(config, str(tmp_path / name), log=lambda line: None)
  trainer.run()
  return trainer, records(tmp_path / name)


@pytest.mark.slow
def test_a_qwen3_moe_train_step_on_data2_expert4_matches_one_device(tmp_path, monkeypatch):
  checkpoint = family_checkpoint(tmp_path / "qwen3_moe", "qwen3_moe")
  single, expected = moe_run(tmp_path, checkpoint, "one", (1, 1))
  traced = []  # the sparse layers the trainer traced expert-parallel
  exchange = moe_parallel.expert_parallel_mlp
  monkeypatch.setattr(moe_parallel, "expert_parallel_mlp",
                      lambda *a, **k: traced.append(k["mesh"]) or exchange(*a, **k))
  sharded, got = moe_run(tmp_path, checkpoint, "mesh", (2, 4))
  assert traced and all(dict(mesh.shape)["expert"] == 4 for mesh in traced)
  assert dict(sharded.mesh.shape) == {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}
  gate = sharded.learner.actor.params["layers"][0]["mlp"]["gate_proj"]
  assert gate.sharding.spec[0] == "expert"
  assert [r.get("reward_mean") for r in got] == [r.get("reward_mean") for r in expected]
  for key in ("loss", "pg_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose([r[key] for r in got], [r[key] for r in expected],
                               rtol=1e-5, atol=1e-6, err_msg=key)
  for a, b in zip(jax.tree.leaves(sharded.learner.actor.params),
                  jax.tree.leaves(single.learner.actor.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
