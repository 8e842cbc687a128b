"""configs/serve.py's validation (every refusal names its config field) and the tiny
model it serves without a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling.serve import config as serve_config_lib
from tests.sampling.serve_configs import serve_config


@pytest.mark.parametrize("field,value,match", [
    ("sampler.prompt_buckets", (16, 200), "config.sampler.prompt_buckets"),
    ("sampler.update_policy", "later", "config.sampler.update_policy"),
    ("sampler.num_slots", 0, "config.sampler.num_slots"),
    ("sampler.address", "nowhere", "config.sampler.address"),
    ("server.port", 70000, "config.server.port"),
    ("model.hidden_size", 60, "config.model.hidden_size"),
    ("tokenizer", "/nonexistent", "config.tokenizer"),
])
def test_serve_config_errors_name_the_field(field, value, match):
  config = serve_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=match.replace(".", r"\.")):
    serve_config_lib.validate_serve_config(config)


def test_serve_config_hf_needs_a_checkpoint():
  with pytest.raises(ValueError, match=r"config\.model\.checkpoint"):
    serve_config_lib.validate_serve_config(serve_config("hf"))


@pytest.mark.slow
def test_tiny_serve_model_has_the_configured_shape():
  config = serve_config()
  config.model.hidden_size, config.model.vocab_size, config.model.num_layers = 24, 40, 1
  serve_config_lib.validate_serve_config(config)
  model, params, tokenizer = serve_config_lib.load_served_model(config)
  assert tokenizer is None
  assert (model.config.hidden_size, model.config.vocab_size, model.config.num_layers,
          model.config.num_heads, model.config.num_kv_heads, model.config.head_dim) == (
              24, 40, 1, 4, 2, 6)
  logits, _ = model.apply(params, np.asarray([[1, 2, 3]], np.int32))
  assert logits.shape == (1, 3, 40)


@pytest.mark.parametrize("field, value, message", [
    ("model.kind", "big", "config.model.kind"),
    ("model.vocab_size", 3, "config.model.vocab_size"),
    ("server.max_workers", 0, "config.server.max_workers"),
    ("server.max_samples_per_request", serve_config_lib.MAX_SAMPLES_PER_REQUEST + 1,
     "config.server.max_samples_per_request"),
    ("server.jetstream_temperature", -0.5, "config.server.jetstream_temperature"),
    ("server.auth", "some", "config.server.auth"),
])
def test_each_refusal_is_a_config_error_of_one_line(field, value, message):
  config = serve_config()
  section, _, name = field.rpartition(".")
  config[section][name] = value
  with pytest.raises(ConfigError) as error:
    serve_config_lib.validate_serve_config(config)
  assert str(error.value).startswith(message + ":") and "\n" not in str(error.value)


def test_the_tiny_configs_validate():
  serve_config_lib.validate_serve_config(serve_config())


def test_serve_config_refuses_an_infinite_temperature_and_unbounded_samples():
  for field, value in (("jetstream_temperature", float("inf")),
                       ("max_samples_per_request", 0),
                       ("max_samples_per_request", 10**6)):
    config = serve_config()
    config.server[field] = value
    with pytest.raises(ConfigError, match=rf"config\.server\.{field}"):
      serve_config_lib.validate_serve_config(config)
