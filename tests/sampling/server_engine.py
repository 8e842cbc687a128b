"""A one-layer decoder and its engine, shared by the server tests of limits and security:
one engine for the run, whose programs the first of them compiles (a new engine traces
and compiles every program again). Its servers run one test at a time."""

from __future__ import annotations

from rlhf_jax import models
from rlhf_jax import sampling

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
MODEL, PARAMS = models.init_model(CONFIG, seed=0)
ENGINE = sampling.Engine(MODEL, num_slots=4, cache_length=32)
