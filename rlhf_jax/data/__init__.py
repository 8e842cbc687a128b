"""rlhf_jax.data: prompt datasets (JSONL) and a resumable, deterministic prompt stream."""

from rlhf_jax.data.jsonl import Example
from rlhf_jax.data.jsonl import PromptStream
from rlhf_jax.data.jsonl import read_jsonl
from rlhf_jax.data.jsonl import write_jsonl

__all__ = ["Example", "PromptStream", "read_jsonl", "write_jsonl"]
