"""models/hf/checkpoint.py: a checkpoint transformers saved, loaded as our decoder with its
logits (padded or not, KV cache), saved back bit for bit (one file or shards) for
transformers to load, a scalar head from a policy's checkpoint, and bad checkpoints named
in one line."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from tests.models.hf_fixtures import VOCAB
from tests.models.hf_fixtures import assert_cached_decode_matches
from tests.models.hf_fixtures import hf_logits
from tests.models.hf_fixtures import save_family_model
from tests.models.hf_fixtures import save_tiny_hf_model

pytest.importorskip("torch")
pytest.importorskip("transformers")

ARCHITECTURES = ("qwen2", "llama")
TOLERANCE = 1e-4
BENCH_DIR = pathlib.Path(__file__).resolve().parents[4] / "shared" / "bench"


@pytest.fixture(scope="module", params=ARCHITECTURES)
def checkpoint(request, tmp_path_factory):
  """(architecture, directory, transformers model, our model, our params)."""
  directory = tmp_path_factory.mktemp(request.param)
  hf_model = save_tiny_hf_model(directory, request.param)
  model, params = models.load_hf_checkpoint(str(directory))
  apply = jax.jit(lambda p, t, m, pos: model.apply(p, t, attention_mask=m, positions=pos)[0])
  return request.param, directory, hf_model, model, params, apply


def random_tokens(seed, shape):
  return np.random.default_rng(seed).integers(3, VOCAB, shape).astype(np.int32)


def test_config_is_read(checkpoint):
  architecture, _, hf_model, model, _, _ = checkpoint
  assert model.config.architecture == architecture
  assert model.config.tie_embeddings == hf_model.config.tie_word_embeddings
  assert (model.config.rope_scaling is not None) == (architecture == "llama")


def test_logits_unpadded(checkpoint):
  _, _, hf_model, _, params, apply = checkpoint
  tokens = random_tokens(0, (2, 12))
  ours = apply(params, tokens, jnp.ones_like(tokens), None)
  np.testing.assert_allclose(ours, hf_logits(hf_model, tokens), atol=TOLERANCE)


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_padded(checkpoint, side):
  _, _, hf_model, _, params, apply = checkpoint
  tokens = random_tokens(1, (3, 10))
  lengths = np.array([10, 7, 4])
  mask = np.zeros_like(tokens)
  for row, length in enumerate(lengths):
    if side == "right":
      mask[row, :length] = 1
    else:
      mask[row, -length:] = 1
  tokens = np.where(mask == 1, tokens, 0)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)
  ours = np.asarray(apply(params, tokens, mask, None))  # positions derived from the mask
  valid = mask == 1
  np.testing.assert_allclose(ours[valid], expected[valid], atol=TOLERANCE)
  # Each padded row equals the same row run alone without padding.
  for row, length in enumerate(lengths):
    alone = tokens[row][valid[row]][None]
    np.testing.assert_allclose(ours[row][valid[row]], hf_logits(hf_model, alone)[0],
                               atol=TOLERANCE)


def test_kv_cache_prefill_and_decode_equal_full_forward(checkpoint):
  _, _, _, model, params, apply = checkpoint
  prompt_len, steps = 6, 8
  tokens = random_tokens(2, (3, prompt_len + steps))
  prompt_mask = np.ones((3, prompt_len), np.int32)
  prompt_mask[1, :2] = 0  # left-padded prompt
  prompt_mask[2, :5] = 0
  full_mask = np.concatenate([prompt_mask, np.ones((3, steps), np.int32)], axis=1)
  tokens = np.where(full_mask == 1, tokens, 0)
  full = np.asarray(apply(params, tokens, full_mask, None))
  cache = assert_cached_decode_matches(model, params, tokens, full_mask, prompt_len, full,
                                       TOLERANCE)
  np.testing.assert_array_equal(cache.length, full_mask.sum(axis=1))


def test_round_trip_is_bit_exact_and_transformers_loads_it(checkpoint, tmp_path):
  _, _, hf_model, model, params, apply = checkpoint
  models.save_hf_checkpoint(str(tmp_path), model, params)
  model2, params2 = models.load_hf_checkpoint(str(tmp_path))
  assert model2.config == model.config
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  import transformers
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  tokens = random_tokens(3, (2, 9))
  np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(hf_model, tokens), atol=1e-6)


def test_sharded_save_and_load(checkpoint, tmp_path):
  _, _, _, model, params, _ = checkpoint
  models.save_hf_checkpoint(str(tmp_path), model, params, max_shard_bytes=64 << 10)
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  _, params2 = models.load_hf_checkpoint(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_scalar_head_from_policy_checkpoint(checkpoint):
  _, directory, _, _, params, _ = checkpoint
  with pytest.raises(ValueError, match="'score.weight' is missing"):
    models.load_hf_checkpoint(str(directory), head="scalar")
  critic, critic_params = models.load_hf_checkpoint(str(directory), head="scalar",
                                                    missing_head="zeros")
  jax.tree.map(np.testing.assert_array_equal, critic_params["layers"], params["layers"])
  values, _ = jax.jit(critic.apply)(critic_params, random_tokens(4, (2, 5)))  # not op by op
  assert values.shape == (2, 5)
  np.testing.assert_array_equal(values, 0.0)


# --------------------------------------------------------------------- bad checkpoints


@pytest.fixture(scope="module")
def qwen_directory(tmp_path_factory):
  directory = tmp_path_factory.mktemp("qwen_for_errors")
  save_tiny_hf_model(directory, "qwen2")
  return directory


@pytest.fixture()
def qwen_copy(qwen_directory, tmp_path):
  """A fresh copy of a valid checkpoint for each test to break."""
  target = tmp_path / "ckpt"
  shutil.copytree(qwen_directory, target)
  return target


def _rewrite_tensors(directory, edit):
  from safetensors.numpy import load_file, save_file
  path = directory / "model.safetensors"
  tensors = load_file(str(path))
  edit(tensors)
  save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_named(qwen_copy):
  _rewrite_tensors(qwen_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
    models.load_hf_checkpoint(str(qwen_copy))


def test_shape_mismatch_is_named(qwen_copy):
  def shrink(tensors):
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors[
        "model.layers.0.self_attn.k_proj.weight"][:-1]
  _rewrite_tensors(qwen_copy, shrink)
  with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape"):
    models.load_hf_checkpoint(str(qwen_copy))


def test_unexpected_tensor_is_named(qwen_copy):
  _rewrite_tensors(qwen_copy, lambda t: t.update(
      {"model.layers.2.mlp.up_proj.weight": np.zeros((2, 2), np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected tensors \['model\.layers\.2\.mlp"):
    models.load_hf_checkpoint(str(qwen_copy))


def test_a_fused_tensor_of_the_wrong_size_is_named(tmp_path):
  save_family_model(tmp_path, "phi3")
  name = "model.layers.1.self_attn.qkv_proj.weight"
  _rewrite_tensors(tmp_path, lambda t: t.update({name: np.concatenate([t[name], t[name][:2]])}))
  with pytest.raises(ValueError, match=rf"fused tensor '{name}' has shape \(98, 48\); "
                     "expected 96 rows"):
    models.load_hf_checkpoint(str(tmp_path))


def test_unknown_architecture_and_missing_files(qwen_copy):
  config_path = qwen_copy / "config.json"
  config = json.loads(config_path.read_text())
  config.update(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox")
  config_path.write_text(json.dumps(config))
  with pytest.raises(ValueError, match="GPTNeoXForCausalLM.*not supported"):
    models.load_hf_checkpoint(str(qwen_copy))
  os.remove(qwen_copy / "model.safetensors")
  config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
  config_path.write_text(json.dumps(config))
  with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
    models.load_hf_checkpoint(str(qwen_copy))
  with pytest.raises(FileNotFoundError, match="config.json does not exist"):
    models.load_hf_checkpoint(str(qwen_copy / "nowhere"))


# --------------------------------------------------------------------- benchmark model


@pytest.mark.slow
def test_benchmark_checkpoint_matches_expected_logits(tmp_path):
  if not (BENCH_DIR / "make_model.py").exists():
    pytest.skip(f"{BENCH_DIR} is not present")
  out = tmp_path / "bench_model"
  subprocess.run([sys.executable, str(BENCH_DIR / "make_model.py"), str(out)], check=True,
                 capture_output=True, timeout=600,
                 env={**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"})
  model, params = models.load_hf_checkpoint(str(out))
  expected = np.load(out / "expected_logits.npz")
  logits, _ = jax.jit(lambda p, t: model.apply(p, t))(params, expected["input_ids"])
  np.testing.assert_allclose(logits, expected["logits"], atol=TOLERANCE)
