"""What the bring-your-own tests and eval.py's test share: a tiny transformers checkpoint of
a family with a chat template, a TRL conversational file, and the flags that size a run
on it for a CPU (tests/launch/test_bring_your_own.py, tests/launch/test_eval.py)."""

import json

from rlhf_jax import models
from tests.models.hf_fixtures import save_family_model

TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MESSAGES = [{"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": "Name a colour."}]
TINY = ["--config.data.prompt_length=96", "--config.sampler.prompt_buckets=96",
        "--config.sampler.cache_length=112", "--config.rollout.max_new_tokens=12",
        "--config.sampler.num_slots=8", "--config.sampler.warmup=False",
        "--config.rollout.prompts_per_step=2", "--config.rollout.group_size=2",
        "--config.train.steps=2", "--config.train.minibatches=1", "--config.train.eval_every=2",
        "--config.train.loggers=", "--config.train.log_rollouts=2",
        "--config.model.logprob_chunk=0", "--config.optimizer.warmup_steps=1"]


def family_checkpoint(directory, family: str) -> str:
  """A tiny random `family` checkpoint saved by transformers, with a BPE tokenizer and a
  chat template."""
  tokenizer = models.train_bpe_tokenizer(
      ["Answer with one word. Name a colour. red green blue"] * 20, vocab_size=200)
  tokenizer.chat_template = TEMPLATE
  tokenizer.save(str(directory))
  save_family_model(directory, family, vocab_size=tokenizer.vocab_size,
                    eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
  return str(directory)


def trl_file(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)
