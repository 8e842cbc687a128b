"""Gemma's embedding scale √hidden_size rounded to the compute dtype as transformers rounds
it (`embed_scale.to(weight.dtype)`): the scalar against torch's own rounding, and a tiny
Gemma 3 of width 1152 (√1152 = 33.94 → 34.0 in bfloat16) embedding tokens bit for bit as
transformers does in bfloat16, from float32 parameters (the trainer's layout)."""

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models.decoder import embedding_scale
from tests.models.hf_fixtures import save_family_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPES))
@pytest.mark.parametrize("hidden", [640, 1152, 2304, 2560, 3584, 3840, 5376])
def test_the_scale_is_rounded_as_torch_rounds_it(hidden, dtype):
  config = models.DecoderConfig(vocab_size=8, hidden_size=hidden, num_layers=1, num_heads=1,
                                num_kv_heads=1, head_dim=16, intermediate_size=8,
                                architecture="gemma3_text", dtype=dtype)
  expected = torch.tensor(hidden ** 0.5, dtype=TORCH_DTYPES[dtype]).item()
  assert float(embedding_scale(config)) == expected
  if dtype == "bfloat16" and hidden == 1152:
    assert expected == 34.0


def test_a_bfloat16_gemma3_embeds_as_transformers_does(tmp_path):
  hf_model = save_family_model(tmp_path, "gemma3_text", hidden_size=1152)
  hf_model = hf_model.to(torch.bfloat16)
  model, params = models.load_hf_checkpoint(str(tmp_path), dtype="bfloat16")
  assert model.config.param_dtype == "float32"  # the trainer keeps float32 weights
  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 7))
  embed = jax.jit(lambda p: model.apply(p, tokens, method=lambda m, t: m.embed_tokens(t)))
  ours = embed(params)  # one program (op by op, each parameter's cast compiled alone)
  with torch.no_grad():
    theirs = hf_model.model.embed_tokens(torch.as_tensor(tokens)).float().numpy()
  assert str(ours.dtype) == "bfloat16"
  np.testing.assert_array_equal(np.asarray(ours, np.float32), theirs)
  # An unrounded scale (33.94) gives other bfloat16 values for a third of the entries.
  unrounded = (np.asarray(params["embed"])[tokens] * 1152 ** 0.5).astype(np.float32)
  assert np.mean(np.asarray(ours, np.float32) != torch.tensor(unrounded).bfloat16().float()
                 .numpy()) > 0.2
