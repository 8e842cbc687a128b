"""rlhf_jax.models: Flax NNX decoder LMs (the HF families of `decoder_config.ARCHITECTURES`)
with KV cache, value and reward heads, HF safetensors import/export, and a tokenizer wrapper.

`attention/` holds the attention kernels and the choice between them, `hf/` the Hugging Face
side (checkpoints in and out, PEFT adapters, the policy directory); `decoder_config` is the
model's own configuration, `config` the run config's `model` section."""

from rlhf_jax.models.decoder import DecoderLM
from rlhf_jax.models.decoder import KVCache
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.decoder_config import RopeScaling
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import critic_from_policy
from rlhf_jax.models.functional import init_model
from rlhf_jax.models.functional import score_at_last_token
from rlhf_jax.models.functional import with_numerics
from rlhf_jax.models.hf.checkpoint import load_hf_checkpoint
from rlhf_jax.models.hf.checkpoint import read_hf_config
from rlhf_jax.models.hf.checkpoint import save_hf_checkpoint
from rlhf_jax.models.hf.config import config_from_hf
from rlhf_jax.models.hf.config import config_to_hf
from rlhf_jax.models.hf.policy_dir import load_prompt_prefix
from rlhf_jax.models.hf.policy_dir import save_policy
from rlhf_jax.models.tokenizer import Tokenizer
from rlhf_jax.models.tokenizer import build_character_tokenizer
from rlhf_jax.models.tokenizer import train_bpe_tokenizer

__all__ = [
    "DecoderConfig", "DecoderLM", "FunctionalModel", "KVCache", "RopeScaling", "Tokenizer",
    "build_character_tokenizer", "config_from_hf", "critic_from_policy", "score_at_last_token", "config_to_hf", "init_model",
    "load_hf_checkpoint", "read_hf_config", "save_hf_checkpoint", "train_bpe_tokenizer",
    "with_numerics", "load_prompt_prefix", "save_policy",
]
