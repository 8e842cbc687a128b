"""`configs/<preset>.py:hf,cpu`: the cpu overlay shrinks a preset's hf sizes to two CPU cores
after the preset's own settings and before the flags (which win); lengths the preset
derived from the response cap shrink with it; a bad overlay is one line. `:arith` is the
task-neutral base with the built-in task's overlay; the retired `variant` field is an
unknown field whose error names the overlay."""

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import CPU_SIZES
from tests.training.runs import parse
from tests.training.runs import preset

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")


def test_the_cpu_overlay_sets_its_sizes_after_the_preset():
  full, cpu = preset("dapo", "hf"), preset("dapo", "hf,cpu")
  for field, value in CPU_SIZES.items():
    section, name = field.split(".")
    assert cpu[section][name] == value, field
  assert cpu.rollout.group_size == full.rollout.group_size == 16  # the preset's own
  # DAPO's overlong buffer is a fifth of the response cap: it shrinks with the cap
  assert full.algorithm.overlong.buffer == full.rollout.max_new_tokens // 5
  assert cpu.algorithm.overlong.buffer == int(full.algorithm.overlong.buffer * 64
                                              / full.rollout.max_new_tokens)
  assert cpu.to_dict().keys() == full.to_dict().keys()  # no field added or lost


def test_flags_win_over_the_overlay():
  config = parse("configs/grpo.py:hf,cpu", "--config.rollout.max_new_tokens=32",
                 "--config.train.steps=3")
  assert (config.rollout.max_new_tokens, config.train.steps) == (32, 3)
  assert config.rollout.prompts_per_step == CPU_SIZES["rollout.prompts_per_step"]


@pytest.mark.parametrize("spec, message", [
    ("configs/grpo.py:hf,gpu", "config overlay 'gpu'"),
    ("configs/grpo.py:arith,cpu", "config overlay 'cpu' applies to the hf base"),
    ("configs/grpo.py:arith", "unknown field.*variant.*overlay.*configs/<preset>.py:arith"),
])
def test_a_bad_overlay_is_one_line(spec, message):
  with pytest.raises(ConfigError, match=message) as caught:
    parse(spec, *(("--config.variant=arith",) if spec.endswith(":arith") else ()))
  assert "\n" not in str(caught.value)


def test_the_base_is_task_neutral_and_arith_is_its_overlay():
  neutral, arith = base_config("hf").to_dict(), base_config("arith").to_dict()
  assert "variant" not in neutral and neutral.keys() == arith.keys()
  # The hf base names no task (one's own data and checkpoint); the arith run's task,
  # its tiny run's sizes (16 prompts of 64 tokens, 60 steps) and rates.
  assert neutral["data"]["task"] == "" and arith["data"]["task"] == "arith"
  assert (arith["rollout"]["prompts_per_step"], arith["rollout"]["max_new_tokens"],
          arith["data"]["prompt_length"], arith["train"]["steps"]) == (16, 64, 64, 60)
  assert (arith["optimizer"]["learning_rate"], arith["train"]["packing"]) == (2e-4, False)
  assert (neutral["rollout"]["prompts_per_step"], neutral["train"]["steps"]) == (128, 1000)
  # Both leave the model from scratch's shape and everything else the same.
  assert arith["model"]["hidden_size"] == neutral["model"]["hidden_size"]
  assert arith["algorithm"] == neutral["algorithm"] and arith["env"] == neutral["env"]
