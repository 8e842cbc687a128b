"""The reward-model launchers and presets end to end with a tiny policy (fresh processes):
train_rm, train_judge (genrm, pairwise), train_prm and make_references, then 2 RL steps
each with the BT RM, hybrid routing, Pairwise-PPO and PPO + PRM (dense rewards, critic
from the PRM)."""

import json

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.data import write_examples
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config
from tests.launch.runs import SMALL
from tests.launch.runs import run

TWO_STEPS = [*SMALL, "--config.train.steps=2", "--config.train.eval_every=2",
             "--config.train.eval_samples=0", "--config.train.loggers=",
             "--config.reward.judge_sampler.warmup=False",
             "--config.reward.judge_sampler.num_slots=8"]


def last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """A tiny SFT policy and a BT RM, GenRM, pairwise judge and PRM trained from it."""
  root = tmp_path_factory.mktemp("reward_models")
  last_json(run("sft.py", "--config=configs/grpo.py:arith", f"--workdir={root}", *SMALL))
  policy = str(root / "sft")
  out = {"root": root, "policy": policy}
  out["rm_report"] = last_json(run("train_rm.py", f"--policy={policy}",
                                   f"--output={root}/rm", "--steps=2", "--num_pairs=20",
                                   "--batch_size=4"))
  for kind in ("genrm", "pairwise"):
    out[f"{kind}_report"] = last_json(run(
        "train_judge.py", f"--kind={kind}", f"--policy={policy}", f"--output={root}/{kind}",
        "--steps=2", "--num_examples=20", "--batch_size=4"))
  out["prm_report"] = last_json(run("train_prm.py", f"--policy={policy}",
                                    f"--output={root}/prm", "--num_prompts=8", "--samples=2",
                                    "--completions=2", "--steps=2", "--batch_size=4",
                                    "--eval_fraction=0.25"))
  return out


@pytest.mark.slow
def test_reward_model_launchers_write_checkpoints_and_report(checkpoints):
  rm = checkpoints["rm_report"]
  assert rm["train_pairs"] == 18 and 0 <= rm["pair_accuracy"] <= 1
  from rlhf_jax import models
  model, _ = models.load_hf_checkpoint(rm["checkpoint"], head="scalar")
  assert model.head == "scalar"
  for kind in ("genrm", "pairwise"):
    assert 0 <= checkpoints[f"{kind}_report"]["verdict_accuracy"] <= 1
  prm = checkpoints["prm_report"]
  assert prm["train_responses"] == 12 and prm["held_out_responses"] == 4
  assert prm["train_steps"] >= prm["train_responses"]
  assert prm["step_label_mse"] >= 0 and prm["constant_baseline_mse"] >= 0


@pytest.mark.slow
def test_make_references_writes_the_best_of_n_by_the_rm(checkpoints):
  root = checkpoints["root"]
  report = last_json(run("make_references.py", "--config=configs/grpo.py:arith",
                         f"--workdir={root}", f"--rm={root}/rm", f"--output={root}/refs.jsonl",
                         "--n=2", "--max_prompts=3", *SMALL))
  assert report["prompts"] == 3
  from rlhf_jax.data import read_examples
  for example in read_examples(str(root / "refs.jsonl")):
    assert isinstance(example.metadata["reference"], str)
    assert "reference_rm_score" in example.metadata


def train_two_steps(workdir, checkpoints, preset, *flags):
  import shutil
  shutil.copytree(checkpoints["policy"], workdir / "sft")
  result = run("train.py", f"--config={preset}", f"--workdir={workdir}", *TWO_STEPS, *flags)
  summary = last_json(result)
  assert summary["steps"] == 2
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_rm_route_trains_on_the_rm_and_evaluates_with_the_verifier(tmp_path, checkpoints):
  rows = train_two_steps(tmp_path, checkpoints, "configs/grpo.py:arith",
                         "--config.reward.route=rm",
                         f"--config.reward.rm.checkpoint={checkpoints['root']}/rm")
  steps = [r for r in rows if "reward/rm/share" in r]
  assert len(steps) == 2 and all(r["reward/rm/share"] == 1.0 for r in steps)
  assert all("reward/rm/true_accuracy" in r for r in steps)
  assert "eval_accuracy" in rows[-1]


@pytest.mark.slow
def test_hybrid_preset_routes_each_kind_of_prompt(tmp_path, checkpoints):
  root = checkpoints["root"]
  train = tmp_path / "mixed.jsonl"
  write_examples(str(train), [
      Example("Ann has 3 pens.\n", "3", "arith"),
      Example("Say a number.\n", "7", "chat"),
      Example("Say hi.\n", "", "chat", metadata={"reference": "hi"}),
      Example("Say no.\n", "", "chat")] * 2)
  rows = train_two_steps(tmp_path / "run", checkpoints, "configs/hybrid.py:arith",
                         f"--config.reward.rm.checkpoint={root}/rm",
                         f"--config.reward.genrm.checkpoint={root}/genrm",
                         f"--config.data.train_file={train}",
                         "--config.rollout.prompts_per_step=4", "--config.data.shuffle=False")
  routes = {k for r in rows for k in r if k.endswith("/share")}
  assert routes == {"reward/verifier/share", "reward/genrm_gt/share",
                    "reward/genrm_reference/share", "reward/rm/share"}


@pytest.mark.slow
def test_pairwise_ppo_preset(tmp_path, checkpoints):
  rows = train_two_steps(tmp_path, checkpoints, "configs/pairwise_ppo.py:arith",
                         f"--config.reward.pairwise.checkpoint={checkpoints['root']}/pairwise",
                         "--config.reward.pairwise.min_verdict_mass=0")  # an untrained judge
  steps = [r for r in rows if "reward/pairwise/share" in r]
  assert len(steps) == 2 and all(r["reward/pairwise/failure_rate"] == 0 for r in steps)
  assert all(-0.5 <= r["reward_mean"] <= 0.5 for r in steps)  # P(y beats anchor) − 0.5


@pytest.mark.slow
def test_prm_ppo_preset_with_critic_from_the_prm(tmp_path, checkpoints):
  prm = f"{checkpoints['root']}/prm"
  rows = train_two_steps(tmp_path, checkpoints, "configs/prm_ppo.py:arith",
                         f"--config.reward.process.checkpoint={prm}",
                         f"--config.critic.init_from={prm}")
  steps = [r for r in rows if "reward/prm/failures" in r]
  assert len(steps) == 2 and all(r["reward/prm/failures"] == 0 for r in steps)


def config_with(checkpoint="/nowhere", **fields):
  c = base_config("arith")
  for path, value in fields.items():
    value = checkpoint if value == "CKPT" else value
    section = c
    *parents, leaf = path.split("__")
    for name in parents:
      section = section[name]
    section[leaf] = value
  return c


@pytest.mark.parametrize("fields, match", [
    ({"reward__route": "oracle"}, "config.reward.route: invalid value 'oracle': must be one of"),
    ({"reward__route": "rm"}, "config.reward.rm.checkpoint: invalid value '': an HF checkpoint "
     "directory is required for reward.route='rm'"),
    ({"reward__route": "hybrid"},
     "config.reward.route: invalid value 'hybrid': needs at least one"),
    ({"reward__route": "pairwise", "reward__pairwise__checkpoint": "/nowhere"},
     "config.reward.pairwise.checkpoint: invalid value '/nowhere': must be an HF "
     "checkpoint directory"),
    ({"reward__route": "genrm_gt", "reward__judge_sampler__address": "localhost:1"},
     "config.reward.genrm.checkpoint: invalid value '': an HF checkpoint directory is "
     "required for reward.route='genrm_gt' (a served judge"),
    ({"reward__process__checkpoint": "/nowhere"}, "config.reward.process.checkpoint"),
    ({"reward__route": "genrm_gt", "reward__genrm__checkpoint": "CKPT",
      "rollout__max_new_tokens": 240, "sampler__cache_length": 320},
     "config.reward.judge_sampler.prompt_buckets: invalid value (128, 256): the largest "
     "must exceed 304 tokens, the longest judge question"),
    ({"critic__init_from": "/nowhere"}, "config.critic.init_from"),
    ({"algorithm__process_reward__shaping": "square"},
     "config.algorithm.process_reward.shaping: invalid value 'square': must be one of "
     "none, clip, delta, clip_delta"),
])
def test_reward_model_config_errors_name_the_field(fields, match, tmp_path):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
    validate_config(config_with(str(tmp_path), **fields))


def test_a_prm_needs_a_token_level_estimator(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  c = config_with(reward__process__checkpoint=str(tmp_path))  # grpo: sequence scores only
  with pytest.raises(ConfigError, match="ignores; use one of gae, reinforce_pp"):
    validate_config(c)
  c.algorithm.advantage.estimator = "gae"
  validate_config(c)
  c.critic.init_from = str(tmp_path)
  validate_config(c)
  c.algorithm.advantage.estimator = "grpo"
  c.reward.process.checkpoint = ""
  with pytest.raises(ConfigError, match="config.critic.init_from: invalid value .*: must be "
                     "empty without a critic"):
    validate_config(c)
