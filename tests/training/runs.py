"""Shared by the tests that run the trainer: a preset by name, the sizes of a CPU run, the
scorer the arith runs use, a Trainer over a warm start, and the metrics it wrote."""

import importlib.util
import json
import pathlib

from absl import flags
from ml_collections import config_flags

from rlhf_jax import cli
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.training import loop
from rlhf_jax.training import stages
from tests.rewards.verifiers import odd_length

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMING = ("elapsed_s", "tokens_per_second")  # and every time_* key: wall clock


def preset(name, base="arith"):
  """configs/<name>.py's config built on `base` ('arith', 'hf', or with overlays: 'hf,cpu')."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(base)


def parse(spec: str, *overrides: str):
  """The config a launcher gets from `--config=<spec> <overrides>` (fresh flags; `spec`
  relative to the repository, e.g. "configs/grpo.py:hf,cpu")."""
  argv = ["launcher", f"--config={ROOT / spec}", *overrides]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "preset", flag_values=values,
                                           lock_config=True, sys_argv=argv)
  cli.parse_flags(argv, values)
  return holder.value


def shrink(config):
  """Sizes for a CPU test: 1-layer 32-wide model, 3 SFT steps, 2 RL steps."""
  config.model.hidden_size, config.model.num_layers, config.model.num_heads = 32, 1, 2
  config.sft.steps, config.sft.batch_size = 3, 8
  config.data.num_train, config.data.num_eval = 64, 8
  config.rollout.prompts_per_step, config.rollout.max_new_tokens = 4, 96
  config.rollout.group_size = 4
  config.algorithm.overlong.buffer = min(config.algorithm.overlong.buffer, 8)
  config.algorithm.value.pretrain_steps = min(config.algorithm.value.pretrain_steps, 1)
  config.sampler.num_slots, config.sampler.cache_length = 16, 64 + 96
  config.sampler.warmup = False
  config.train.steps, config.train.eval_every = 2, 2
  config.rollout.windows.window_tokens = 48  # T-PPO: two windows reach the cap.
  return config


def scorer(config):
  """Rewards odd-length answers (a verifier a 2-step run moves)."""
  return RewardRouter({"arith": odd_length}, correct_score=config.reward.correct_score,
                      wrong_score=config.reward.wrong_score)


def make_trainer(config, workdir, **kwargs):
  """The arith warm start (if missing) and a Trainer scoring with `odd_length`."""
  stages.ensure_arith_warm_start(config, str(workdir), log=lambda line: None)
  return loop.Trainer(config, str(workdir), log=lambda line: None, scorer=scorer(config),
                      **kwargs)


def records(directory):
  """The metrics.jsonl records of a run directory."""
  return [json.loads(line) for line in open(directory / "metrics.jsonl")]
