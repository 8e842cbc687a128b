"""A tiny decoder with peaked next-token distributions, its engine and scheduler: what the
sampling and search tests share."""

import jax
import numpy as np

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.sampling.scheduler.scheduler import Scheduler

VOCAB = 64
CONFIG = models.DecoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
NEWLINE = 7
BUCKETS = (8, 16)


def peaked_params(seed=0, scale=60.0):
  """A random model whose next-token distributions are far from uniform."""
  model, params = models.init_model(CONFIG, seed=seed)
  params = dict(params)
  head = "embed" if CONFIG.tie_embeddings else "lm_head"
  params[head] = params[head] * scale
  return model, params


MODEL, PARAMS = peaked_params()
ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=40, newline_token_ids=(NEWLINE,))
FORWARD = jax.jit(lambda params, tokens: MODEL.apply(params, tokens)[0])


def scheduler(**kwargs):
  """A Scheduler over ENGINE with PARAMS (or `params=`) and BUCKETS."""
  return Scheduler(ENGINE, kwargs.pop("params", PARAMS), prompt_buckets=BUCKETS, **kwargs)


def prompts(count, seed=0):
  """`count` random prompts of 1–12 tokens."""
  rng = np.random.default_rng(seed)
  return [list(map(int, rng.integers(8, VOCAB, rng.integers(1, 13)))) for _ in range(count)]
