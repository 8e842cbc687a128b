"""train.py, sft.py, eval.py and plot.py as a user runs them (fresh processes)."""

import json
import math

import pytest

from rlhf_jax.rollout.evaluation import pass_at_k
from tests.launch.runs import SMALL
from tests.launch.runs import run

def test_pass_at_k_matches_its_definition():
  assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0
  assert math.isclose(pass_at_k(5, 2, 2), 1 - math.comb(3, 2) / math.comb(5, 2))
  assert math.isclose(pass_at_k(8, 3, 1), 3 / 8)
  with pytest.raises(ValueError, match="k=3 exceeds"):
    pass_at_k(2, 1, 3)


@pytest.mark.slow
def test_train_rejects_a_bad_field_in_one_line_before_loading_anything(tmp_path):
  result = run("train.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}",
               "--config.algorithm.policy_loss.clip_high=0.1")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: config.algorithm.policy_loss.clip_high: invalid value 0.1: must be >= 0.2 "
      "(algorithm.policy_loss.clip_low)"]
  assert not (tmp_path / "sft").exists()
  result = run("train.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}",
               "--validate_only")
  assert result.returncode == 0 and result.stdout.strip() == "config ok", result.stderr
  assert not (tmp_path / "sft").exists()  # nothing trained or loaded
  for flag in ("--config.algorithm.bogus=1", "--config.algorithm.policy_loss.clip_hihg=0.3"):
    result = run("train.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}", flag)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {flag[2:].split('=')[0]}: unknown field")
    assert "Traceback" not in result.stderr


def held_out_levels(num_eval: int) -> set[str]:
  """The levels of the held-out problems a generated arith run evaluates on."""
  from rlhf_jax.training import inputs
  from rlhf_jax.training.config import base_config
  config = base_config("arith")
  config.data.num_eval, config.data.num_train = num_eval, 1
  return {f"L{e.metadata['level']}" for e in inputs.load_examples(config)[1]}


# Every logger; W&B offline (wandb_records.offline_env), MLflow in <workdir>/mlflow.db.
LOGGED = ["--config.train.loggers=tensorboard,wandb,mlflow", "--config.train.log_rollouts=2"]


def check_loggers(workdir) -> None:
  """W&B and MLflow got the numbers of metrics.jsonl at their steps, and the samples."""
  from mlflow import MlflowClient
  from tests.training.wandb_records import read_runs

  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  (wandb_run,) = read_runs(workdir)
  client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
  mlflow_run = (workdir / "mlflow_run_id").read_text().strip()
  for record in records:
    numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
    logged = wandb_run["history"][record["step"]]
    assert {k: logged[k] for k in numbers} == pytest.approx(numbers, nan_ok=True)
    for key in ("eval_accuracy", "eval_pass@4", "reward_mean"):
      if key in record:
        (metric,) = [m for m in client.get_metric_history(mlflow_run, key.replace("@", "_"))
                     if m.step == record["step"]]
        assert metric.value == pytest.approx(record[key])
  (table,) = wandb_run["tables"].values()
  samples = [json.loads(line) for line in (workdir / "rollouts.jsonl").read_text().splitlines()]
  assert [row[:2] for row in table["data"]] == [[1, s["reward"]] for s in samples]
  assert list(workdir.glob("tensorboard/events.out.tfevents.*"))


@pytest.mark.slow
def test_train_then_eval_then_plot(tmp_path, monkeypatch):
  from tests.training.wandb_records import offline_env
  from tests.training.wandb_records import read_runs

  offline_env(monkeypatch, tmp_path / "wandb_home")
  monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
  result = run("train.py", "--config=configs/grpo.py:arith", f"--workdir={tmp_path}", *SMALL,
               *LOGGED)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["event"] == "done" and summary["steps"] == 1
  check_loggers(tmp_path)
  policy = summary["policy"]
  result = run("eval.py", f"--checkpoint={policy}", "--samples=4", "--temperature=1.0",
               "--arith_count=6", "--num_slots=8")
  assert result.returncode == 0, result.stderr[-3000:]
  (scores,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert scores["prompts"] == 6 and {"pass@1", "pass@2", "pass@4"} <= set(scores)
  assert 0 <= scores["pass@1"] <= scores["pass@2"] <= scores["pass@4"] <= 1
  result = run("eval.py", f"--checkpoint={policy},{policy}", "--samples=2", "--temperature=1.0",
               "--arith_count=4", "--num_slots=8", "--fire=none,first_token,every_line",
               f"--table={tmp_path / 'passk.md'}", f"--plot={tmp_path / 'passk.png'}")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert [r["fire"] for r in lines] == ["none", "first_token", "every_line"] * 2
  assert lines[0] == lines[3]  # the same checkpoint and seed: the same samples
  table = (tmp_path / "passk.md").read_text().splitlines()
  passk = table[table.index(next(t for t in table if t.startswith("| sampling |"))):]
  assert [row.split("|")[1].strip() for row in passk[2:]] == ["none", "first_token",
                                                              "every_line"]
  assert (tmp_path / "passk.png").stat().st_size > 1000
  result = run("eval.py", f"--checkpoint={policy}", "--fire=first_token")
  assert result.returncode == 2 and result.stderr.strip().splitlines() == [
      "error: --fire=first_token: --fire needs --temperature > 0 (FIRE is a sampling mode)"]
  result = run("plot.py", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "plots" / "summary.png").stat().st_size > 1000
  assert (tmp_path / "plots" / "reward_mean.png").exists()
  result = run("report.py", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  table = (tmp_path / "report.md").read_text()
  rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
  levels = held_out_levels(4)
  assert rows == (sorted(levels) if len(levels) > 1 else []) + ["all"], table
  evaluations = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
                 if "eval_accuracy" in line]
  assert [r["step"] for r in evaluations] == [0, 1]
  assert all(0 <= r["eval_sampled_accuracy"] <= r["eval_pass@4"] <= 1 for r in evaluations)
  assert (tmp_path / "report.png").stat().st_size > 1000
  # Re-running with the same workdir resumes (here: nothing left to do), in the same runs.
  result = run("train.py", "--config=configs/grpo.py:arith", f"--workdir={tmp_path}", *SMALL,
               *LOGGED)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from step 1" in result.stdout
  first, resumed = read_runs(tmp_path)
  assert first["id"] == resumed["id"] and resumed["exit_code"] == 0


@pytest.mark.slow
def test_sft_launcher_reports_accuracy(tmp_path):
  result = run("sft.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}", *SMALL)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["checkpoint"] == str(tmp_path / "sft") and 0 <= report["accuracy"] <= 1
  assert (tmp_path / "sft" / "prompt_format.json").exists()


@pytest.mark.slow
def test_pycalc_preset_with_a_curriculum_runs_end_to_end(tmp_path):
  """2 GRPO steps on pycalc (every sample run in the sandbox) with a task schedule."""
  from rlhf_jax.data import write_examples
  from rlhf_jax.tasks import arith
  from rlhf_jax.tasks import pycalc
  train = tmp_path / "mix.jsonl"
  write_examples(str(train), pycalc.examples(5, 16, (1,)) + arith.examples(6, 16, (1,)))
  result = run("train.py", "--config=configs/pycalc.py", f"--workdir={tmp_path}", *SMALL,
               "--config.train.steps=2", "--config.rollout.prompts_per_step=4",
               f"--config.data.train_file={train}",
               "--config.data.curriculum=pycalc:1@1; pycalc:1,arith:1")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "reward_mean" in r]
  assert steps[0]["data/task_mix/pycalc"] == 4 and "data/task_mix/arith" not in steps[0]
  assert steps[1]["data/task_mix/pycalc"] == 2 and steps[1]["data/task_mix/arith"] == 2
  assert steps[0]["reward/pycalc/samples"] == 8  # 4 prompts × group_size 2
  assert steps[0]["reward/pycalc/failure_rate"] == 0.0
  assert steps[1]["reward/arith/samples"] == 4
  # Resuming continues the schedule where it was (nothing left to do here).
  result = run("train.py", "--config=configs/pycalc.py", f"--workdir={tmp_path}", *SMALL,
               "--config.train.steps=2", "--config.rollout.prompts_per_step=4",
               f"--config.data.train_file={train}",
               "--config.data.curriculum=pycalc:1@1; pycalc:1,arith:1")
  assert result.returncode == 0 and "resumed from step 2" in result.stdout


@pytest.mark.slow
def test_sweep_runs_arms_and_seeds_reuses_finished_runs_and_tabulates(tmp_path):
  small = " ".join(flag.removeprefix("--config.") for flag in SMALL)
  args = ["--config=configs/grpo.py:arith", f"--root={tmp_path}", "--seeds=0",
          f"--warm_start={tmp_path}/sft{{seed}}", f"--warm_start_set={small}",
          f"--set={small} train.steps=2 train.eval_every=1 train.eval_samples=0",
          "--arm=base:", "--arm=sym: algorithm.policy_loss.clip_high=0.2",
          "--stat=final:eval_accuracy", "--stat=mean:entropy",
          f"--table={tmp_path / 'row.md'}", f"--plot={tmp_path / 'row.png'}",
          "--plot_metrics=eval_accuracy,entropy"]
  result = run("sweep.py", *args)
  assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
  assert (tmp_path / "sft0" / "config.json").exists()
  for arm in ("base", "sym"):
    records = [json.loads(line) for line in
               (tmp_path / arm / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 2
  assert "--config.algorithm.policy_loss.clip_high=0.2" in (
      tmp_path / "sym" / "seed0" / "train.log").read_text().splitlines()[0]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert set(summary["summary"]) == {"base", "sym"}
  table = (tmp_path / "row.md").read_text().splitlines()
  assert [row.split("|")[1].strip() for row in table[2:]] == ["base", "sym"]
  assert (tmp_path / "row.png").stat().st_size > 1000
  again = run("sweep.py", *args)  # finished runs are reused, not retrained
  assert again.returncode == 0 and "[sweep]" not in again.stdout
  assert json.loads(again.stdout.strip().splitlines()[-1]) == summary
  bad = run("sweep.py", *[a.replace("--arm=base:", "--arm=base: algorithm.policy_loss.clip_hihg=1")
                           for a in args[:-5]], f"--root={tmp_path / 'bad'}")
  assert bad.returncode == 2 and not (tmp_path / "bad").exists(), bad.stderr
  assert len(bad.stderr.strip().splitlines()) == 1
  assert bad.stderr.startswith("error: arm 'base': config.algorithm.policy_loss.clip_hihg")
  changed = run("sweep.py", *[a.replace("clip_high=0.2", "clip_high=0.3") for a in args])
  # an arm whose settings changed is refused before any arm runs, by the workdir's rule
  assert changed.returncode == 2, changed.stderr
  assert len(changed.stderr.strip().splitlines()) == 1
  assert ("error: arm 'sym': --workdir=" in changed.stderr and "was made with another "
          "config: algorithm.policy_loss.clip_high 0.2 → 0.3" in changed.stderr), changed.stderr
