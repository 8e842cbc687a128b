"""DPO, iterative DPO and DQO from their presets and launch/train.py (fresh processes,
a tiny policy), launch/label_samples.py, and their config errors (the offline data and
rollout: tests/data/test_labelled.py, tests/rollout/test_offline.py)."""

import json

import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import PreferencePair
from rlhf_jax.data import read_labelled
from rlhf_jax.data import write_pairs
from rlhf_jax.tasks import arith
from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.config import validate_config
from tests.launch.runs import SMALL
from tests.launch.runs import run

STEPS = [*SMALL, "--config.train.steps=2", "--config.train.eval_every=2",
         "--config.train.eval_samples=0", "--config.train.loggers=",
         "--config.data.offline_prompts=6", "--config.data.offline_samples=2"]
TOKENIZER = arith.tokenizer()


def last_json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def metrics(workdir):
  return [json.loads(line) for line in open(workdir / "metrics.jsonl", encoding="utf-8")]


def solved_pairs(count):
  """Pairs of arith problems: the worked solution against a wrong answer."""
  out = []
  for problem in arith.generate(5, count, levels=(1,)):
    record = problem.to_json()
    solution = "\n".join(arith.solution_lines(problem.a, problem.b, problem.op))
    out.append(PreferencePair(record["prompt"], solution, "Answer: 0"))
  return out


@pytest.mark.slow
def test_dpo_preset_on_a_pair_file(tmp_path):
  pairs = tmp_path / "pairs.jsonl"
  write_pairs(str(pairs), solved_pairs(12))
  args = ["train.py", "--config=configs/dpo.py:arith", f"--workdir={tmp_path / 'run'}",
          *STEPS, f"--config.data.offline_file={pairs}"]
  summary = last_json(run(*args))
  assert summary["steps"] == 2
  rows = [m for m in metrics(tmp_path / "run") if "loss" in m]
  assert len(rows) == 2
  # Step 1: π = π_ref (cached), so z = 0 and the loss is log 2 on every pair.
  assert rows[0]["loss"] == pytest.approx(np.log(2), abs=1e-5)
  assert rows[0]["dpo/pairs_with_preference"] == 1.0
  assert {"reward_margin", "reward_accuracy", "chosen_logps", "rejected_logps"} <= set(rows[0])


@pytest.mark.slow
def test_dqo_and_iterative_dpo_presets_run_from_generated_data(tmp_path):
  summary = last_json(run("train.py", "--config=configs/dqo.py:arith",
                          f"--workdir={tmp_path / 'dqo'}", *STEPS))
  assert summary["steps"] == 2
  labelled = read_labelled(str(tmp_path / "dqo" / "offline.jsonl"))
  assert len(labelled) == 6 and all(len(g.responses) == 2 for g in labelled)
  row = [m for m in metrics(tmp_path / "dqo") if "loss" in m][-1]
  assert {"q_mean", "critic_loss", "value_mean", "dqo/target_mean", "dqo/trace_mean"} <= set(row)
  summary = last_json(run("train.py", "--config=configs/iterative_dpo.py:arith",
                          f"--workdir={tmp_path / 'idpo'}", *STEPS,
                          "--config.algorithm.dpo.reference_sync_every=1"))
  assert summary["steps"] == 2
  assert not (tmp_path / "idpo" / "offline.jsonl").exists()  # online: no offline data
  report = last_json(run("label_samples.py", "--config=configs/dqo.py:arith",
                         f"--workdir={tmp_path / 'dqo'}", f"--output={tmp_path}/l.parquet",
                         f"--pairs_output={tmp_path}/p.jsonl", *SMALL,
                         "--config.data.offline_prompts=5", "--config.data.offline_samples=3"))
  assert report["prompts"] == 5 and report["samples"] == 15
  assert [len(g.responses) for g in read_labelled(f"{tmp_path}/l.parquet")] == [3] * 5


def test_offline_config_errors_name_the_field(tmp_path):
  dpo = sibling_preset("configs/dpo.py", "dpo", "arith")
  dpo.algorithm.dpo.beta = 0.0
  with pytest.raises(ConfigError,
                     match=r"config\.algorithm\.dpo\.beta: invalid value 0\.0: must be > 0"):
    validate_config(dpo)
  dpo = sibling_preset("configs/dpo.py", "dpo", "arith")
  dpo.rollout.mode = "groups"
  with pytest.raises(ConfigError, match="algorithm.dpo.reference: invalid value 'cached': must "
                     "be 'online' unless rollout.mode='offline'"):
    validate_config(dpo)
  ppo = sibling_preset("configs/ppo.py", "ppo", "arith")
  ppo.rollout.mode = "offline"
  with pytest.raises(ConfigError,
                     match="rollout.mode: invalid value 'offline': trains on fixed data"):
    validate_config(ppo)
  dqo = sibling_preset("configs/dqo.py", "dqo", "hf")
  dqo.model.checkpoint = "x"  # offline training needs no prompt file, but labelled data
  with pytest.raises(ConfigError, match="data.offline_file: invalid value '': labelled"):
    validate_config(dqo)
  dpo = sibling_preset("configs/dpo.py", "dpo", "arith")
  dpo.rollout.group_size = 8
  with pytest.raises(ConfigError,
                     match="rollout.group_size: invalid value 8: must be 2 for offline DPO"):
    validate_config(dpo)
  idpo = sibling_preset("configs/iterative_dpo.py", "iterative_dpo", "arith")
  idpo.rollout.mode = "windows"
  idpo.algorithm.advantage.estimator = "gae"
  with pytest.raises(ConfigError, match="rollout.mode: invalid value 'windows': must be one of "
                     "groups, dynamic, offline for algorithm.learner='dpo'"):
    validate_config(idpo)
  hf = sibling_preset("configs/dpo.py", "dpo", "hf")
  hf.model.checkpoint, hf.data.offline_file = "x", str(tmp_path / "pairs.jsonl")
  with pytest.raises(ConfigError, match="data.offline_file: invalid value .*: must be an "
                     "existing .jsonl/.parquet file"):
    validate_config(hf)
  (tmp_path / "pairs.jsonl").write_text("")
  validate_config(hf)  # offline training needs no prompt file
  dpo = sibling_preset("configs/dpo.py", "dpo", "arith")
  dpo.algorithm.learner = "kto"
  with pytest.raises(ConfigError,
                     match="algorithm.learner: invalid value 'kto': must be one of ppo, dpo, dqo"):
    validate_config(dpo)
