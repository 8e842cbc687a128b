"""rlhf_jax.data: prompt, preference-pair and labelled-sample sources (JSONL, Parquet, TFDS), the resumable
prompt stream, task curricula and Pre-PPO prompt selection."""

from rlhf_jax.data.curriculum import CurriculumStream
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.data.example import Example
from rlhf_jax.data.jsonl import PromptStream
from rlhf_jax.data.jsonl import read_jsonl
from rlhf_jax.data.jsonl import write_jsonl
from rlhf_jax.data.labelled import LabelledGroup
from rlhf_jax.data.labelled import read_labelled
from rlhf_jax.data.labelled import write_labelled
from rlhf_jax.data.pairs import PreferencePair
from rlhf_jax.data.pairs import read_pairs
from rlhf_jax.data.pairs import write_pairs
from rlhf_jax.data.sources import read_examples
from rlhf_jax.data.sources import read_tfds
from rlhf_jax.data.sources import write_examples

__all__ = ["CurriculumStream", "Example", "LabelledGroup", "PreferencePair", "PromptStream",
           "parse_curriculum", "read_examples", "read_jsonl", "read_labelled", "read_pairs",
           "read_tfds", "write_examples", "write_jsonl", "write_labelled", "write_pairs"]
