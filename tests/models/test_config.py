"""models/config.py: the run config's `model` section. Its defaults pass; each bad field
is one ConfigError naming it; the width of a model from scratch must split into even
heads; the decoder made from scratch has the section's shape; the numerics it hands the
trainer are the model's runtime fields."""

from __future__ import annotations

import ml_collections
import pytest

from rlhf_jax import models
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.models import config as model_section
from rlhf_jax.models.functional import RUNTIME_FIELDS


def section(**changes) -> ml_collections.ConfigDict:
  """The `model` section's defaults with `changes`."""
  m = model_section.model_config()
  m.update(changes)
  return m


def run_config(task: str = "", **changes) -> ml_collections.ConfigDict:
  """The two sections `check_model_section` reads: `model` and `data.task`."""
  return ml_collections.ConfigDict({"model": section(**changes), "data": {"task": task}})


@pytest.mark.parametrize("from_scratch", [False, True])
def test_the_defaults_pass(from_scratch):
  model_section.validate_model_config(section(), from_scratch=from_scratch)


@pytest.mark.parametrize("field, value", [
    ("dtype", "float8"),
    ("matmul_precision", "tf32"),
    ("attention_impl", "flash"),
    ("decode_attention", "cudnn"),
    ("expert_kernel", "megablox"),
    ("hidden_size", 0),
    ("num_layers", -1),
    ("num_heads", 0),
    ("logprob_chunk", -1),
    ("remat_policy", "sometimes"),
    ("lora_rank", -1),
    ("lora_alpha", 0.0),
    ("lora_targets", ("q_proj", "fc1")),
])
def test_each_bad_field_is_one_error_naming_it(field, value):
  with pytest.raises(ConfigError, match=rf"^config\.model\.{field}: invalid value ") as error:
    model_section.validate_model_config(section(**{field: value}), from_scratch=False)
  assert error.value.field == f"model.{field}" and "\n" not in str(error.value)


@pytest.mark.parametrize("hidden_size, num_heads", [(30, 4), (20, 4)])
def test_a_scratch_width_must_split_into_even_heads(hidden_size, num_heads):
  """30 / 4 heads is no whole width; 20 / 4 = 5 is odd (RoPE rotates pairs). A checkpoint
  brings its own shape: the same fields are then not read."""
  bad = run_config(hidden_size=hidden_size, num_heads=num_heads)
  with pytest.raises(ConfigError, match=r"^config\.model\.hidden_size: invalid value "):
    model_section.check_model_section(bad, None)
  bad.model.checkpoint = "/some/checkpoint"
  model_section.check_model_section(bad, None)
  bad.data.task = "arith"  # a built-in task's warm start trains a model from scratch
  with pytest.raises(ConfigError, match=r"^config\.model\.hidden_size: "):
    model_section.check_model_section(bad, None)


def test_the_scratch_decoder_has_the_sections_shape():
  m = section(hidden_size=96, num_layers=2, num_heads=6)
  config = model_section.scratch_decoder(m, vocab_size=70, max_positions=300)
  assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
          config.max_position_embeddings) == (70, 96, 2, 6, 300)
  assert config.num_kv_heads == 3 and config.head_dim == 16  # GQA over half the heads
  assert config.intermediate_size == 3 * 96
  one_head = model_section.scratch_decoder(section(hidden_size=16, num_heads=1),
                                           vocab_size=70, max_positions=300)
  assert one_head.num_kv_heads == 1


def test_the_numerics_are_the_models_runtime_fields():
  m = section(dtype="bfloat16", matmul_precision="high", logprob_chunk=64, remat=True,
              remat_policy="dots_saveable", attention_impl="xla", decode_attention="pallas",
              expert_kernel="tiled")
  numerics = model_section.model_numerics(m)
  assert set(numerics) <= RUNTIME_FIELDS
  model, _ = models.init_model(model_section.scratch_decoder(
      section(), vocab_size=32, max_positions=64), abstract=True)
  trained = models.with_numerics(model, **numerics)
  assert {name: getattr(trained.config, name) for name in numerics} == dict(
      dtype="bfloat16", matmul_precision="high", logprob_chunk=64, remat=True,
      remat_policy="dots_saveable", attention_impl="xla", decode_attention="pallas",
      expert_kernel="tiled")
  assert model_section.model_layout(section(scan_layers=True)) == {"scan_layers": True}
