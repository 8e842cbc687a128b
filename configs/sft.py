"""Supervised fine-tuning on one's own data: the warm start before RL (launch/sft.py).

  python launch/sft.py --config=configs/sft.py:hf --workdir=/tmp/mine \
      --config.model.checkpoint=DIR --config.sft.train_file=conversations.jsonl
  python launch/train.py --config=configs/grpo.py:hf --config.model.checkpoint=/tmp/mine/sft ...

`sft.train_file` holds conversations ({"messages": [...]}) or prompt/completion pairs
(TRL's SFT layouts); the loss is the token mean over the assistant's tokens (the chat
template's assistant spans, or the completion). With `model.checkpoint` empty, a
`model.*`-sized decoder and a byte-level BPE tokenizer of `sft.vocab_size` tokens are
made from scratch. The :arith preset is the built-in task's warm start (as in every preset).
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "hf"):
  """SFT of an `hf` checkpoint on one's own data (or the `arith` warm start)."""
  c = base_config(base)
  if base == "hf":
    c.sft.steps = 200
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-5  # a pretrained checkpoint; from scratch: ~1e-3
  return c
