"""models/hf/peft.py: our LoRA adapters as PEFT adapter files. Names and shapes against
PEFT's naming convention written here, values round trip bit for bit, a critic's head saved
as `score`, each bad key or tensor named in one line; and, where `peft` is installed, the
files applied by peft to the transformers model of the same weights give our logits, and
an adapter peft wrote loads into ours."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models import lora as lora_lib
from rlhf_jax.models.hf import peft as peft_lib
from tests.models.lora_fixtures import CONFIG
from tests.models.lora_fixtures import E
from tests.models.lora_fixtures import LAYERS
from tests.models.lora_fixtures import LORA
from tests.models.lora_fixtures import MODULE
from tests.models.lora_fixtures import SIZES
from tests.models.lora_fixtures import TOKENS
from tests.models.lora_fixtures import leaves_equal
from tests.models.lora_fixtures import random_adapters

HF_MODULE = {"attention": "self_attn", "mlp": "mlp"}


@pytest.fixture(scope="module")
def base():
  return models.init_model(CONFIG, seed=0)


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


def test_phi3_adapters_are_refused_in_one_line():
  """Phi-3 fuses q/k/v and gate/up in its checkpoint: PEFT would name one fused module."""
  phi3 = dict(architectures=["Phi3ForCausalLM"], vocab_size=100, hidden_size=48,
              num_hidden_layers=2, num_attention_heads=4, intermediate_size=80)
  with pytest.raises(ValueError, match="architecture='phi3' are not supported yet"):
    peft_lib.peft_tensors(models.init_model(models.config_from_hf(phi3), abstract=True)[0], {})
