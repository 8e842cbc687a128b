"""An exported policy keeps its checkpoint: a Llama-3.1-style bfloat16 checkpoint (eos a
list of three stop ids, a generation_config.json, the published Llama 3.1 chat template)
loaded, changed as by one training step, written with `save_policy`, and read back by
transformers with the same token ids, generation config, dtype, size, logits (the same
change made in torch) and chat rendering; a policy built here takes its ids from its
tokenizer."""

import json
import os

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models.hf import metadata as hf_metadata
from tests.models.chat_fixtures import write_checkpoint
from tests.models.hf_fixtures import hf_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the temperature in Paris right now?"},
        {"role": "assistant", "content": "It is 22.5 degrees."}]
# Llama 3.1's stop ids are <|end_of_text|>, <|eom_id|>, <|eot_id|> (128001, 128008, 128009).
STOP_TOKENS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


def save_llama31_style(directory):
  """Tokenizer files + a 2-layer LlamaForCausalLM saved by transformers in bfloat16, eos a
  list and a generation_config.json as Llama-3.1-8B-Instruct's; returns the torch model."""
  write_checkpoint(directory, "llama3_1_instruct")
  backend = models.Tokenizer.from_directory(str(directory)).backend
  bos = backend.token_to_id("<|begin_of_text|>")
  eos = [backend.token_to_id(t) for t in STOP_TOKENS]
  config = transformers.LlamaConfig(
      vocab_size=backend.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
      rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=bos, eos_token_id=eos,
      tie_word_embeddings=False, attention_bias=False,
      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32})
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      torch.nn.init.normal_(parameter, std=0.2)
  model = model.to(torch.bfloat16)
  model.generation_config = transformers.GenerationConfig(
      bos_token_id=bos, eos_token_id=eos, do_sample=True, temperature=0.6, top_p=0.9)
  model.save_pretrained(str(directory), safe_serialization=True)
  return model


def read(path):
  with open(path, "rb") as f:
    return f.read()


def test_a_trained_llama31_exports_as_its_checkpoint(tmp_path):
  source, out = tmp_path / "source", tmp_path / "out"
  hf_model = save_llama31_style(source)
  model, params = models.load_hf_checkpoint(str(source))
  tokenizer = models.Tokenizer.from_directory(str(source))
  assert model.source.dtype == "bfloat16"
  # One "training step": a delta on one tensor (ours [E, F] is HF's up_proj.weight [F, E]ᵀ).
  delta = np.random.default_rng(0).normal(0, 0.05, params["layers"][1]["mlp"]["up_proj"].shape)
  params = jax.tree.map(lambda x: x, params)
  params["layers"][1]["mlp"]["up_proj"] = params["layers"][1]["mlp"]["up_proj"] + delta
  # The launchers export the model they train with (its numerics changed by with_numerics).
  trained = models.with_numerics(model, matmul_precision="high")
  models.save_policy(str(out), trained, params, tokenizer, [])
  # The same step in torch, on the source as transformers loads it (a model cast to bf16
  # after building, as hf_model, also casts its RoPE frequencies).
  expected = transformers.AutoModelForCausalLM.from_pretrained(str(source)).eval()
  tokens = np.random.default_rng(1).integers(0, hf_model.config.vocab_size, (2, 9))
  before = hf_logits(expected, tokens)
  with torch.no_grad():
    up = expected.model.layers[1].mlp.up_proj.weight
    up.copy_((up.float() + torch.as_tensor(delta.T, dtype=torch.float32)).to(torch.bfloat16))

  source_config = json.loads(read(source / "config.json"))
  written = json.loads(read(out / "config.json"))
  assert written["eos_token_id"] == source_config["eos_token_id"] == hf_model.config.eos_token_id
  assert written["bos_token_id"] == source_config["bos_token_id"]
  assert written.get("pad_token_id") == source_config.get("pad_token_id")
  assert written["dtype"] == "bfloat16"
  for key, value in source_config.items():  # every key transformers wrote is kept
    assert written[key] == value, key
  assert read(out / "generation_config.json") == read(source / "generation_config.json")

  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
  assert reloaded.dtype == torch.bfloat16
  assert reloaded.config.eos_token_id == hf_model.config.eos_token_id
  assert reloaded.generation_config.to_dict() == transformers.GenerationConfig.from_pretrained(
      str(source)).to_dict()
  source_size = os.path.getsize(source / "model.safetensors")
  assert abs(os.path.getsize(out / "model.safetensors") - source_size) < 0.01 * source_size
  for name, tensor in expected.state_dict().items():
    assert torch.equal(reloaded.state_dict()[name], tensor), name
  assert np.max(np.abs(hf_logits(expected, tokens) - before)) > 1e-2  # the step shows
  np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(expected, tokens))

  rendered = [transformers.AutoTokenizer.from_pretrained(str(d)).apply_chat_template(
      CHAT, tokenize=False, add_generation_prompt=True) for d in (source, out)]
  assert rendered[0] == rendered[1] and "<|start_header_id|>assistant" in rendered[0]


def test_a_policy_built_here_takes_its_ids_from_its_tokenizer(tmp_path):
  write_checkpoint(tmp_path / "tok", "llama3_1_instruct")
  tokenizer = models.Tokenizer.from_directory(str(tmp_path / "tok"))
  config = models.DecoderConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=1,
                                num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=48,
                                architecture="llama", qkv_bias=False)
  model, params = models.init_model(config)
  models.save_policy(str(tmp_path / "out"), model, params, tokenizer, [], dtype="bfloat16")
  bos = tokenizer.backend.token_to_id("<|begin_of_text|>")
  ids = {"bos_token_id": bos, "eos_token_id": tokenizer.eos_id,
         "pad_token_id": tokenizer.pad_id}
  written = json.loads(read(tmp_path / "out" / "config.json"))
  assert {key: written[key] for key in ids} == ids
  assert json.loads(read(tmp_path / "out" / "generation_config.json")) == ids
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
  assert reloaded.dtype == torch.bfloat16 and reloaded.config.pad_token_id == tokenizer.pad_id
  # Without a tokenizer or a source: float32 (the param dtype) and null ids, no generation
  # config (a stale one from the save before is removed).
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  written = json.loads(read(tmp_path / "out" / "config.json"))
  assert [written[key] for key in ids] == [None] * 3 and written["dtype"] == "float32"
  assert not (tmp_path / "out" / "generation_config.json").exists()
  with pytest.raises(ValueError, match=r"^save_hf_checkpoint: dtype='fp8'; allowed: "):
    models.save_hf_checkpoint(str(tmp_path / "out"), model, params, dtype="fp8")


def test_tokenizer_ids_outside_the_vocabulary_are_null():
  class Small:
    bos_token, eos_id, pad_id = None, 3, 40
  assert hf_metadata.tokenizer_ids(Small(), vocab_size=32) == {
      "bos_token_id": None, "eos_token_id": 3, "pad_token_id": None}


def test_export_writes_the_source_config_json_back_key_for_key(tmp_path):
  """A Qwen2 config.json with transformers 4 keys (max_window_layers 28, rope_theta,
  torch_dtype absent), a key of its authors' own and a null: exported after a training
  step it is the same dict; stored in another dtype only its own dtype key says so."""
  from tests.models.hf_fixtures import save_tiny_hf_model
  source = tmp_path / "source"
  save_tiny_hf_model(source, "qwen2")
  config = json.loads(read(source / "config.json"))
  config.pop("torch_dtype", None)
  config.update(max_window_layers=28, use_sliding_window=False, rope_theta=10000.0,
                sliding_window=None, lab_note={"run": 7, "seeds": [1, 2]}, dtype="float32")
  (source / "config.json").write_text(json.dumps(config))
  model, params = models.load_hf_checkpoint(str(source))
  params = jax.tree.map(lambda x: x + 0.01, params)  # the step
  models.save_hf_checkpoint(str(tmp_path / "out"), models.with_numerics(model, remat=True),
                            params)
  assert json.loads(read(tmp_path / "out" / "config.json")) == config
  models.save_hf_checkpoint(str(tmp_path / "bf16"), model, params, dtype="bfloat16")
  assert json.loads(read(tmp_path / "bf16" / "config.json")) == dict(config, dtype="bfloat16")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
  assert reloaded.config.max_window_layers == 28


def test_the_source_is_read_as_the_directory_holds_it(tmp_path):
  """config.json as parsed, generation_config.json when there is one, and the tensors'
  dtype by its safetensors name (one that is not ours, FP8, reads as None)."""
  config = {"architectures": ["Qwen2ForCausalLM"], "lab_note": {"seeds": [1, 2]}}
  generation = {"eos_token_id": [3, 4], "temperature": 0.6}
  (tmp_path / hf_metadata.GENERATION_CONFIG_FILE).write_text(json.dumps(generation))
  source = hf_metadata.read_source(str(tmp_path), config, "BF16")
  assert (source.config, source.generation_config, source.dtype) == (
      config, generation, "bfloat16")
  os.remove(tmp_path / hf_metadata.GENERATION_CONFIG_FILE)
  source = hf_metadata.read_source(str(tmp_path), config, "F8_E4M3")
  assert (source.generation_config, source.dtype) == (None, None)
  assert hf_metadata.read_json(str(tmp_path / "nowhere.json")) is None


def test_a_source_describes_the_model_of_its_own_shape_only():
  config = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=8, intermediate_size=48)
  written = models.config_to_hf(config)
  source = hf_metadata.CheckpointSource(config=dict(written, dtype="bfloat16",
                                                    torch_dtype="bfloat16"),
                                        generation_config=None, dtype="bfloat16")
  assert hf_metadata.describes(source, config)  # the dtype keys aside
  assert hf_metadata.describes(source, config.replace(remat=True))  # numerics aside
  assert not hf_metadata.describes(source, config.replace(intermediate_size=64))
  assert not hf_metadata.describes(source, config.replace(rope_theta=1e6))
