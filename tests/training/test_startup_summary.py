"""Saying what is happening: the trainer's start-up summary (family, parameters, dtypes,
devices and mesh, rows read, batch shape, tokens per step), the first step announced as
compiling with its time, and one plain line per step where the output is no terminal
(pytest's capture, a log file) instead of a bar redrawn with carriage returns."""

import jax
import numpy as np
import pytest

from rlhf_jax.training import loggers
from rlhf_jax.training import loop
from rlhf_jax.training import stages
from tests.training.runs import preset
from tests.training.runs import scorer
from tests.training.runs import shrink


def test_progress_bar_in_a_log_is_one_plain_line_per_step(capsys):
  with loggers.progress_bar(3, "PRM") as progress:
    for step, loss in enumerate((0.5, 0.25, 0.125)):
      progress(step, loss)
  out, err = capsys.readouterr()
  assert out.splitlines() == ["PRM step 1/3: loss 0.5000", "PRM step 2/3: loss 0.2500",
                              "PRM step 3/3: loss 0.1250"]
  assert "\r" not in out + err


@pytest.mark.slow
def test_a_run_says_what_it_is_and_that_its_first_step_compiles(tmp_path, capsys):
  config = shrink(preset("grpo"))
  config.train.eval_every = 10  # the start and the end
  stages.ensure_arith_warm_start(config, str(tmp_path), log=lambda line: None)
  lines = []  # no terminal here (pytest captures): plain lines, no bar
  trainer = loop.Trainer(config, str(tmp_path), log=lines.append, scorer=scorer(config),
                         progress=True)
  trainer.run()
  out, err = capsys.readouterr()
  assert "\r" not in out + err  # no bar was drawn
  text = "\n".join(lines)
  params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(trainer.policy.params))
  assert lines[0] == (f"policy: qwen2, {params / 1e6:.2f}M parameters, float32 parameters, "
                      "float32 compute")
  assert lines[1].startswith(f"devices: {jax.device_count()} x cpu")
  assert "mesh data 1 x fsdp 1 x expert 1 x tensor 1" in lines[1]
  assert lines[2] == (f"data: {config.data.num_train} train rows from generated arith "
                      f"problems; {config.data.num_eval} eval rows from generated arith problems")
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  tokens = rows * (config.data.prompt_length + config.rollout.max_new_tokens)
  assert lines[3].startswith(f"batch: 4 prompts x 4 samples = {rows} responses per step; "
                             f"up to {tokens:,} tokens per step")
  assert "step 1: compiling the step's programs" in text
  assert "step 1: compiled and ran in" in text
  steps = [line for line in lines if line.startswith(("step 1/2:", "step 2/2:"))]
  assert len(steps) == 2 and all("reward" in line for line in steps)
