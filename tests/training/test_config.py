"""The whole config is checked before anything runs, and a bad field is one clear line.

For every preset in configs/ (each file and variant): an unknown key is rejected while
the flags are parsed, naming the full path as an "unknown field" with the close
matches; a value out of range is rejected by the preset's validator as an "invalid
value" with the allowed range. In-process through `cli.parse_flags` (what every
launcher runs), plus a few launcher runs in a fresh process for the printed line, the
exit status and the time it takes (no warm start).
"""

import copy
import math
import os
import pathlib
import subprocess
import sys
import time

import ml_collections
import pytest

from rlhf_jax.config_errors import INVALID_VALUE
from rlhf_jax.config_errors import UNKNOWN_FIELD
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import check_range
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling.serve.config import validate_serve_config
from rlhf_jax.training import config as trainer_config
from rlhf_jax.training.config import validate_config
from tests.training.runs import parse
from tests.training.runs import preset

# ml_collections loads preset files with the deprecated importlib load_module().
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
ROOT = pathlib.Path(__file__).resolve().parents[2]
# The presets that are not trainer configs: their variants, and the launcher that checks them.
# The trainer's presets, each validated as it is.
PRESETS = ("ppo", "grpo", "dapo", "vcppo", "vapo", "tppo", "gspo", "cispo", "dpo",
           "iterative_dpo", "dqo", "toolcalc")
OTHER_PRESETS = {"serve.py": ("tiny", "hf"), "kernel_demo.py": (None,)}
# A misspelt field and the field it should suggest, and a value out of range with the
# start of its requirement, per kind of preset.
BAD_KEY = {"trainer": ("rollout.temprature", "temperature"),
           "serve.py": ("server.prot", "port"), "kernel_demo.py": ("clip_hihg", "clip_high")}
BAD_VALUE = {"trainer": ("rollout.temperature", "-1", "-1.0", "must be >= 0"),
             "serve.py": ("server.port", "70000", "70000", "must be in [0, 65535]")}


def preset_specs() -> list[str]:
  """Every `configs/<file>[:variant]` a user can name."""
  specs = []
  for path in sorted((ROOT / "configs").glob("*.py")):
    variants = OTHER_PRESETS.get(path.name, trainer_config.PRESET_BASES)
    specs += [f"configs/{path.name}" + (f":{v}" if v else "") for v in variants]
  return specs


def kind(spec: str) -> str:
  name = spec.split("/")[1].split(":")[0]
  return name if name in OTHER_PRESETS else "trainer"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
  """What a user must supply: an HF checkpoint directory and data files."""
  root = tmp_path_factory.mktemp("inputs")
  (root / "ckpt").mkdir()
  (root / "ckpt" / "config.json").write_text("{}")
  (root / "data.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "task": "arith"}\n')
  return {"ckpt": str(root / "ckpt"), "data": str(root / "data.jsonl")}


def required(spec: str, inputs) -> list[str]:
  """The overrides a user gives for `spec` to be runnable: the checkpoint and data of the
  hf variant, the model a model-based reward route reads."""
  name, _, variant = spec.split("/")[1].partition(":")
  args = []
  if variant == "hf":
    args = [f"--config.model.checkpoint={inputs['ckpt']}"]
    if name not in OTHER_PRESETS:
      args += [f"--config.data.train_file={inputs['data']}",
               f"--config.data.offline_file={inputs['data']}"]
  if name == "hybrid.py":
    args.append(f"--config.reward.rm.checkpoint={inputs['ckpt']}")
  if name == "pairwise_ppo.py":
    args.append(f"--config.reward.pairwise.checkpoint={inputs['ckpt']}")
  if name == "distill.py":
    args.append(f"--config.algorithm.distill.teacher={inputs['ckpt']}")
  return args


def validate(spec: str, config) -> None:
  """The check the preset's launcher runs first."""
  if kind(spec) == "serve.py":
    validate_serve_config(config)
  else:
    trainer_config.validate_config(config, num_devices=1)


def assert_error(error: ConfigError, path: str, error_kind: str) -> str:
  message = str(error)
  assert "\n" not in message
  assert message.startswith(f"config.{path}: {error_kind}"), message
  assert (error.field, error.kind) == (path, error_kind)
  return message


def test_every_preset_file_is_covered():
  names = {spec.split("/")[1].split(":")[0] for spec in preset_specs()}
  assert names == {path.name for path in (ROOT / "configs").glob("*.py")}
  assert set(OTHER_PRESETS) <= names and len(names) > 10


@pytest.mark.parametrize("spec", [s for s in preset_specs() if kind(s) != "kernel_demo.py"])
def test_every_preset_validates_with_the_inputs_it_needs(spec, inputs):
  config = parse(spec, *required(spec, inputs))
  validate(spec, config)


def workaround(spec: str) -> list[str]:
  return ["--config.algorithm.overlong.buffer=256"] if spec.endswith("dapo.py:hf") else []


@pytest.mark.parametrize("spec", preset_specs())
def test_every_preset_rejects_an_unknown_key_by_its_full_path(spec, inputs):
  path, suggestion = BAD_KEY[kind(spec)]
  with pytest.raises(ConfigError) as error:
    parse(spec, *required(spec, inputs), f"--config.{path}=1")
  message = assert_error(error.value, path, UNKNOWN_FIELD)
  assert message.endswith(f"did you mean '{suggestion}'?") or f"'{suggestion}'" in message
  with pytest.raises(ConfigError) as error:  # a whole section that does not exist
    parse(spec, *required(spec, inputs), "--config.nosuchsection.field=1")
  assert_error(error.value, "nosuchsection", UNKNOWN_FIELD)


@pytest.mark.parametrize("spec", [s for s in preset_specs() if kind(s) != "kernel_demo.py"])
def test_every_preset_rejects_a_bad_value_with_its_range(spec, inputs):
  path, text, shown, requirement = BAD_VALUE[kind(spec)]
  config = parse(spec, *required(spec, inputs), *workaround(spec), f"--config.{path}={text}")
  with pytest.raises(ConfigError) as error:
    validate(spec, config)
  message = assert_error(error.value, path, INVALID_VALUE)
  assert message.startswith(f"config.{path}: invalid value {shown}: {requirement}"), message


@pytest.mark.parametrize("spec", [s for s in preset_specs() if kind(s) == "trainer"])
def test_every_trainer_preset_rejects_a_value_of_the_wrong_type(spec, inputs):
  for override, path, expected in (("train.steps=abc", "train.steps", "an int"),
                                   ("rollout.top_p=high", "rollout.top_p", "a number"),
                                   ("train.packing=maybe", "train.packing",
                                    "true or false")):
    with pytest.raises(ConfigError) as error:
      parse(spec, *required(spec, inputs), f"--config.{override}")
    message = assert_error(error.value, path, INVALID_VALUE)
    assert message.endswith(f": expected {expected}"), message


def test_unknown_keys_without_a_close_match_list_the_section():
  with pytest.raises(ConfigError) as error:
    parse("configs/grpo.py:arith", "--config.rollout.dynamic.zzz=1")
  assert str(error.value) == ("config.rollout.dynamic.zzz: unknown field; config.rollout."
                              "dynamic has keep_surplus, max_age, max_rounds, oversample, signal")
  with pytest.raises(ConfigError) as error:
    parse("configs/grpo.py:arith", "--config.train.steps.every=1")
  assert_error(error.value, "train.steps.every", UNKNOWN_FIELD)
  assert "config.train.steps is a value (int), not a section" in str(error.value)


def test_good_overrides_still_apply():
  config = parse("configs/grpo.py:arith", "--config.rollout.temperature=0.5",
                 "--config.train.steps", "7", "--noconfig.data.shuffle",
                 "--config.data.levels=(1,3)", "--config.train.loggers=")
  assert (config.rollout.temperature, config.train.steps) == (0.5, 7)
  assert config.data.shuffle is False and tuple(config.data.levels) == (1, 3)
  assert config.train.loggers == ""


def leaves(config, prefix=""):
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from leaves(value, f"{prefix}{name}.")
    else:
      yield f"{prefix}{name}", value


def with_value(config, path: str, value):
  *sections, name = path.split(".")
  section = config
  for part in sections:
    section = section[part]
  section[name] = value


@pytest.mark.parametrize("preset", ["ppo", "dpo", "dqo"])
def test_every_number_field_is_checked(preset):
  """The whole config, not a chosen few fields: NaN in any float field and -5 in any int
  field is refused, naming that field (no field is left unchecked)."""
  base = parse(f"configs/{preset}.py:arith")
  fields = [(p, v) for p, v in leaves(base)
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
  assert len(fields) > 60
  for path, value in fields:
    config = copy.deepcopy(base)
    with_value(config, path, math.nan if isinstance(value, float) else -5)
    with pytest.raises(ConfigError) as error:
      trainer_config.validate_config(config, num_devices=1)
    assert error.value.field == path, (path, str(error.value))
    assert error.value.kind == INVALID_VALUE


@pytest.mark.parametrize("field, values", [
    ("temperature", [-1.0, -1e-9, 0.0, 0.7, 1.0, 5.0]),
    ("top_p", [-0.1, 0.0, 1e-6, 0.5, 1.0, 1.0001]),
    ("top_k", [-3, -1, 0, 1, 50]),
])
def test_rollout_sampling_ranges_are_the_samplers(field, values):
  """The config accepts exactly what SamplingParams accepts, so a bad value is caught
  before the warm start rather than at the first rollout."""
  base = parse("configs/grpo.py:arith")
  for value in values:
    config = copy.deepcopy(base)
    with_value(config, f"rollout.{field}", value)
    try:
      SamplingParams(**{field: value})
      sampler_ok = True
    except ValueError:
      sampler_ok = False
    try:
      trainer_config.validate_config(config, num_devices=1)
      config_ok = True
    except ConfigError as error:
      assert_error(error, f"rollout.{field}", INVALID_VALUE)
      config_ok = False
    assert config_ok == sampler_ok, (field, value)


@pytest.mark.parametrize("value, bounds, ok, requirement", [
    (0.5, dict(low=0, high=1), True, None),
    (1.0, dict(low=0, high=1, high_open=True), False, "must be in [0, 1)"),
    (0.0, dict(low=0, low_open=True), False, "must be > 0"),
    (-2, dict(low=-1), False, "must be >= -1"),
    (7, dict(high=5, note="(5: all)"), False, "must be <= 5 (5: all)"),
    (math.nan, dict(low=0), False, "must be >= 0"),
    (math.nan, dict(high=0), False, "must be <= 0"),
])
def test_check_range(value, bounds, ok, requirement):
  if ok:
    check_range("a.b", value, **bounds)
    return
  with pytest.raises(ConfigError) as error:
    check_range("a.b", value, **bounds)
  assert str(error.value) == f"config.a.b: invalid value {value!r}: {requirement}"


def run(script: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
  start = time.monotonic()
  result = subprocess.run([sys.executable, f"launch/{script}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return result, time.monotonic() - start


# A fresh train.py process apiece (~2 s of CPU): the quick subset runs the unknown field,
# the suite both (validate_config's messages are tested in process above).
@pytest.mark.parametrize("override, line", [
    pytest.param("--config.rollout.temperature=-1",
                 "error: config.rollout.temperature: invalid value -1.0: must be >= 0 "
                 "(0: greedy)", marks=pytest.mark.slow),
    ("--config.rollout.temprature=1",
     "error: config.rollout.temprature: unknown field; did you mean 'temperature' or "
     "'fire_temperature'?"),
])
def test_train_fails_in_one_line_before_the_warm_start(override, line, tmp_path):
  workdir = tmp_path / "run"
  result, seconds = run("train.py", "--config=configs/dapo.py:arith", f"--workdir={workdir}",
                        override)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [line]
  assert seconds < 60 and not workdir.exists()  # no warm start, nothing written


@pytest.mark.slow  # tests/launch/test_launch.py runs demo.py's one-line refusal quickly
def test_the_kernel_demo_rejects_a_bad_value_in_one_line():
  result, _ = run("demo.py", "--config=configs/kernel_demo.py", "--config.gamma=2")
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [
      "error: config.gamma: invalid value 2.0: must be in [0, 1]"]


@pytest.mark.parametrize("learner", ["dpo", "dqo"])
def test_value_pretraining_is_refused_outside_the_ppo_learner(learner):
  """DPO's and DQO's learners always update the policy: a pretraining count would be ignored."""
  from rlhf_jax.training.config import base_config, validate_config
  config = base_config("arith")
  config.algorithm.learner = learner
  config.algorithm.advantage.estimator = "gae"
  config.algorithm.value.pretrain_steps = 3
  with pytest.raises(ConfigError, match=r"config\.algorithm\.value\.pretrain_steps: invalid "
                     r"value 3: must be 0 for algorithm\.learner"):
    validate_config(config)


def test_training_run_validates_once_before_any_work_and_stops_at_validate_only(tmp_path):
  """`rlhf_jax.training.run`, launch/train.py's one call: a bad field is one line before the
  workdir is made; `validate_only` checks config, workdir and data files and stops."""
  from rlhf_jax import training  # pylint: disable=import-outside-toplevel
  c = trainer_config.base_config("arith")
  c.rollout.temperature = -1.0
  with pytest.raises(ConfigError, match=r"^config\.rollout\.temperature: invalid value -1\.0"):
    training.run(c, str(tmp_path / "bad"))
  assert not (tmp_path / "bad").exists()
  lines = []
  c.rollout.temperature = 1.0
  assert training.run(c, str(tmp_path / "ok"), validate_only=True, log=lines.append) is None
  assert lines == ["config ok"]
  assert not (tmp_path / "ok" / "sft").exists()  # no warm start


@pytest.mark.parametrize("name", PRESETS)
def test_presets_validate(name):
  validate_config(preset(name), num_devices=1)


@pytest.mark.parametrize("field,value,match", [
    ("algorithm.policy_loss.clip_high", 0.1, r"config\.algorithm\.policy_loss\.clip_high: "
     r"invalid value 0\.1: must be >= 0\.2 \(algorithm\.policy_loss\.clip_low\)"),
    ("algorithm.advantage.estimator", "ppo2", r"config\.algorithm\.advantage\.estimator: "
     r"invalid value 'ppo2': must be one of gae"),
    ("algorithm.policy_loss.agg", "mean",
     r"config\.algorithm\.policy_loss\.agg: invalid value 'mean': must be one of token-mean"),
    ("algorithm.value.pretrain_steps", 5, r"config\.algorithm\.value\.pretrain_steps: "
     r"invalid value 5: must be 0 without a critic"),
    ("rollout.mode", "windows", r"config\.rollout\.mode: invalid value 'windows': T-PPO's "
     "windows need a critic"),
    ("rollout.mode", "beam", r"config\.rollout\.mode: invalid value 'beam': must be one of "
     "groups, dynamic, windows, multi_turn, offline"),  # then any registered ones
    ("rollout.group_size", 1, r"config\.rollout\.group_size: invalid value 1: must be >= 2"),
    ("rollout.temperature", -1.0, r"config\.rollout\.temperature: invalid value -1\.0: "
     "must be >= 0"),
    ("train.minibatches", 7, r"config\.train\.minibatches: invalid value 7: must divide"),
    ("train.micro_batches", 3,
     r"config\.train\.micro_batches: invalid value 3: must divide the 64 rows"),
    ("sampler.cache_length", 100, r"config\.sampler\.cache_length: invalid value 100: must "
     r"be >= 128 = data\.prompt_length 64 \+ rollout\.max_new_tokens 64"),
    ("sampler.dtype", "float8", r"config\.sampler\.dtype: invalid value 'float8': must be "
     "one of float32"),
    ("model.matmul_precision", "tf32", r"config\.model\.matmul_precision: invalid value "
     "'tf32': must be one of auto"),
    ("mesh.data", 4, r"config\.mesh: invalid value .*: data×fsdp×expert×tensor = 4 must be "
     "<= the 1 available devices"),
    ("algorithm.kl.reference_ema", 0.1, r"config\.algorithm\.kl\.reference_ema: invalid "
     "value 0.1: must be 0 without a KL term"),
    ("algorithm.kl.placement", "loss", r"config\.algorithm\.kl\.coef: invalid value 0\.0: "
     r"must be > 0 with algorithm\.kl\.placement='loss'"),
    ("algorithm.kl.controller", "adaptive", r"config\.algorithm\.kl\.controller: invalid "
     r"value 'adaptive': must be 'fixed' unless algorithm\.kl\.placement='reward'"),
    ("algorithm.policy_loss.dual_clip", 0.5, r"config\.algorithm\.policy_loss\.dual_clip: "
     r"invalid value 0\.5: must be > 1"),
    ("algorithm.correction.mode", "clip", r"config\.algorithm\.correction\.mode: invalid "
     "value 'clip': must be one of auto, none, tis"),
    ("algorithm.correction.threshold", 1.0, r"config\.algorithm\.correction\.threshold: "
     r"invalid value 1\.0: must be > 1$"),
    ("sft.carry_slip", 1.5, r"config\.sft\.carry_slip: invalid value 1\.5: must be in "
     r"\[0, 1\]"),
    ("sft.levels", (1, 2, 3), r"config\.sft\.level_weights: invalid value \(1\.0, 2\.0\): "
     r"must have one weight per sft\.levels \(3\)"),
    ("train.eval_samples", -1, r"config\.train\.eval_samples: invalid value -1: must be >= 0"),
    ("optimizer.schedule", "linear", r"config\.optimizer\.schedule: invalid value 'linear': "
     "must be one of constant, cosine"),
])
def test_validation_names_the_field(field, value, match):
  config = preset("dapo")
  *sections, name = field.split(".")
  section = config
  for part in sections:
    section = section[part]
  section[name] = value
  with pytest.raises(ConfigError, match=match):
    validate_config(config, num_devices=1)


def test_mesh_validation_names_the_field():
  config = preset("dapo")  # 16 prompts × 8 samples = 128 rollouts per step
  config.mesh.data, config.mesh.fsdp = -1, 1
  validate_config(config, num_devices=8)
  config.rollout.prompts_per_step, config.train.minibatches = 3, 1  # 24 rollouts
  with pytest.raises(ValueError, match=r"config\.rollout\.prompts_per_step: invalid value 3: "
                     r"the 24 rollouts per step .* must split evenly over mesh "
                     r"data×fsdp×expert = 16"):
    validate_config(config, num_devices=16)
  config.mesh.data, config.mesh.fsdp = -1, 5
  with pytest.raises(ValueError, match=r"config\.mesh: invalid value .*cannot cover 8 devices"):
    validate_config(config, num_devices=8)


def test_tppo_validation():
  config = preset("tppo")
  config.rollout.windows.window_tokens = 0
  with pytest.raises(ValueError, match=r"config\.rollout\.windows\.window_tokens: invalid "
                     "value 0: must be >= 1"):
    validate_config(config, num_devices=1)
  config = preset("tppo")
  config.sampler.prompt_buckets = (64,)
  with pytest.raises(ValueError, match=r"config\.sampler\.prompt_buckets: invalid value "
                     r"\(64,\): must reach 128 = data\.prompt_length 64 \+ the whole windows "
                     r"of rollout\.windows\.window_tokens 32"):
    validate_config(config, num_devices=1)


def test_hf_variant_needs_checkpoint_and_data():
  config = preset("grpo", "hf")
  with pytest.raises(ValueError, match=r"config\.model\.checkpoint: invalid value '': an HF "
                     "checkpoint directory is required"):
    validate_config(config, num_devices=1)
  config.model.checkpoint = "/some/dir"
  with pytest.raises(ValueError, match=r"config\.data\.train_file: invalid value '': a prompt "
                     "file .* is required"):
    validate_config(config, num_devices=1)


def test_unknown_keys_are_rejected_by_the_locked_config():
  config = preset("grpo")
  config.lock()
  with pytest.raises(AttributeError, match="clip_hihg"):
    config.algorithm.policy_loss.clip_hihg = 0.3
