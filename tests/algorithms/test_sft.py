"""SFT on one's own data (algorithms/sft.py, launch/sft.py hf): packed rows give the padded
loss, and a model from scratch that launch/train.py then trains with RL."""

import json

import pytest

from rlhf_jax import models
from rlhf_jax.data.conversations import supervised_row
from rlhf_jax.data.prompts import PromptFormat
from tests.data.chat_rows import CONVERSATION
from tests.data.chat_rows import chatml_tokenizer
from tests.launch.runs import run


@pytest.fixture(scope="module")
def tokenizer():
  return chatml_tokenizer()


@pytest.mark.slow
def test_sft_from_scratch_on_conversations_then_rl_from_its_checkpoint(tmp_path):
  data = tmp_path / "chats.jsonl"
  data.write_text("".join(json.dumps({"messages": [
      {"role": "user", "content": f"{a}+{a}?"},
      {"role": "assistant", "content": str(2 * a)}]}) + "\n" for a in range(20)))
  small = ["--config.model.hidden_size=32", "--config.model.num_layers=1",
           "--config.model.num_heads=2", "--config.data.prompt_length=32",
           "--config.sampler.prompt_buckets=32", "--config.sampler.cache_length=48",
           "--config.rollout.max_new_tokens=8", "--config.sampler.num_slots=8",
           "--config.sampler.warmup=False", "--config.model.logprob_chunk=0"]
  sft = run("sft.py", "--config=configs/sft.py:hf", f"--workdir={tmp_path}",
            f"--config.sft.train_file={data}", "--config.sft.steps=3",
            "--config.sft.batch_size=4", "--config.sft.vocab_size=300",
            "--config.sft.learning_rate=1e-3", *small)
  assert sft.returncode == 0, sft.stderr[-3000:]
  checkpoint = json.loads(sft.stdout.strip().splitlines()[-1])["checkpoint"]
  assert checkpoint == str(tmp_path / "sft")
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a}?"}],
                                         "solution": str(2 * a)}) + "\n" for a in range(4)))
  rl = run("train.py", "--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'rl'}",
           f"--config.model.checkpoint={checkpoint}", f"--config.data.train_file={prompts}",
           "--config.data.columns=answer=solution", "--config.data.default_task=doubling",
           "--config.reward.function=tests.rewards.reward_fns:solution_match",
           "--config.rollout.prompts_per_step=2", "--config.rollout.group_size=2",
           "--config.train.steps=1", "--config.train.minibatches=1",
           "--config.train.loggers=", *small)
  assert rl.returncode == 0, rl.stderr[-3000:]
  assert json.loads(rl.stdout.strip().splitlines()[-1])["steps"] == 1


@pytest.mark.slow
def test_packed_rows_give_the_padded_loss(tokenizer):
  import numpy as np
  from rlhf_jax.algorithms.sft import sft_loss
  from rlhf_jax.algorithms.sft import supervised_batches
  from rlhf_jax.tasks import arith
  prompts = PromptFormat(tokenizer)
  rows = [supervised_row({"messages": CONVERSATION[:3]}, "a", prompts),
          supervised_row({"messages": CONVERSATION}, "b", prompts),
          supervised_row({"prompt": "2+2?", "completion": " 4"}, "c", prompts)]
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
      max_positions=128), seed=1)
  options = dict(batch_size=4, seed=0, prompt_length=40, response_length=40,
                 pad_id=tokenizer.pad_id)
  padded = supervised_batches(rows, **options)(0)
  batch, packed = supervised_batches(rows, packing=True, **options)(0)
  np.testing.assert_array_equal(batch.tokens, padded.tokens)
  assert packed.buffers < 4  # four rows share fewer buffers than rows
  np.testing.assert_allclose(sft_loss(model, params, batch, packed),
                             sft_loss(model, params, padded), rtol=1e-5)
