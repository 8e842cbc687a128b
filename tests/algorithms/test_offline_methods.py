"""DPO, iterative DPO and DQO from their presets and launch/train.py (fresh processes,
a tiny policy), launch/label_samples.py, the offline data and rollout, and their config
errors."""

import json

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.batch import response_logprobs
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import LabelledGroup
from rlhf_jax.data import PreferencePair
from rlhf_jax.data import read_labelled
from rlhf_jax.data import write_labelled
from rlhf_jax.data import write_pairs
from rlhf_jax.data.example import Example
from rlhf_jax.rollout.offline import OfflineRollout
from rlhf_jax.rollout.offline import cache_reference_logprobs
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.rollout.offline import encode_groups
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
  dqo = sibling_preset("configs/dqo.py", "dqo", "arith")
  dqo.algorithm.dqo.lam = 1.5
  with pytest.raises(ConfigError,
                     match=r"algorithm\.dqo\.lam: invalid value 1\.5: must be in \[0, 1\]"):
    validate_config(dqo)
  dqo = sibling_preset("configs/dqo.py", "dqo", "hf")
  dqo.model.checkpoint = "x"  # offline training needs no prompt file, but labelled data
  with pytest.raises(ConfigError, match="data.offline_file: invalid value '': labelled"):
    validate_config(dqo)
  dpo = sibling_preset("configs/dpo.py", "dpo", "arith")
  dpo.rollout.group_size = 8
  with pytest.raises(ConfigError,
                     match="rollout.group_size: invalid value 8: must be 2 for offline DPO"):
    validate_config(dpo)
  dqo = sibling_preset("configs/dqo.py", "dqo", "arith")
  dqo.rollout.group_size = 4
  with pytest.raises(ConfigError, match="rollout.group_size: invalid value 4: must equal "
                     "data.offline_samples=8"):
    validate_config(dqo)
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


def group(prompt, responses, scores):
  return LabelledGroup(Example(prompt, "", "arith"), tuple(responses), tuple(scores),
                       tuple(s > 0 for s in scores))


def test_labelled_files_pairs_and_groups_round_trip(tmp_path):
  groups = [group("1+1?\n", ["2", "3", "4"], [1.0, 0.0, 0.0])]
  write_labelled(str(tmp_path / "g.jsonl"), groups)
  assert read_labelled(str(tmp_path / "g.jsonl"))[0].responses == ("2", "3", "4")
  # A chat prompt survives the file (parquet too), so the groups encode as they were drawn.
  chat = LabelledGroup(Example("q", "1", "math", {"k": 1}, [{"role": "system", "content": "s"},
                                                           {"role": "user", "content": "q"}]),
                       ("1",), (1.0,), (True,))
  for name in ("c.jsonl", "c.parquet"):
    write_labelled(str(tmp_path / name), [chat])
    assert read_labelled(str(tmp_path / name)) == [chat]
  write_pairs(str(tmp_path / "p.jsonl"), [PreferencePair("q", "good", "bad")])
  pair = read_labelled(str(tmp_path / "p.jsonl"))[0]
  assert pair.responses == ("good", "bad") and pair.scores == (1.0, 0.0)
  (tmp_path / "bad.jsonl").write_text('{"prompt": "q", "responses": ["a"], "scores": [1, 2]}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'scores' must be a list of 1"):
    read_labelled(str(tmp_path / "bad.jsonl"))


def test_encode_groups_reduces_to_pairs_drops_ties_and_cuts_long_responses():
  labelled = [group("1+1?\n", ["7", "2", "2", "9"], [0.0, 1.0, 1.0, 0.0]),
              group("2+2?\n", ["4", "4"], [1.0, 1.0]),
              group("3+3?\n", ["6" * 20, "5"], [1.0, 0.0])]
  groups, counts = encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8),
                                 response_length=6, group_size=2, pairs=True)
  assert counts == {"dropped": 1, "truncated": 1}
  assert [TOKENIZER.decode(r) for r in groups[0].responses] == ["2", "7"]  # best, worst
  assert groups[1].responses[0] == TOKENIZER.encode("6" * 6) and groups[1].truncated == [
      True, False]
  with pytest.raises(ValueError, match="offline group 0 has 4 responses; set rollout.group_size=4"):
    encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8), response_length=6,
                  group_size=2)  # DQO keeps whole groups
  with pytest.raises(ValueError, match="offline group 0: the prompt has 5 tokens"):
    encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=4), response_length=6,
                  group_size=2, pairs=True)


def test_cached_reference_logprobs_are_the_reference_forward_and_the_stream_resumes():
  model, params = models.init_model(arith.model_config(
      vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
      max_positions=32), seed=3)
  labelled = [group(f"{i}+1?\n", [str(i + 1), str(i)], [1.0, 0.0]) for i in range(5)]
  shapes = dict(prompt_length=8, response_length=6, pad_id=TOKENIZER.pad_id)
  groups, _ = encode_groups(labelled, PromptFormat(TOKENIZER, prompt_length=8),
                            response_length=6, group_size=2)
  forward = jax.jit(lambda rows: response_logprobs(model, params, rows))
  cache_reference_logprobs(groups, forward, chunk=2, **shapes)
  rollout = OfflineRollout(groups, prompts_per_step=5, seed=0, shuffle=False, **shapes)
  batch = rollout.collect().batch
  np.testing.assert_allclose(batch.sampler_logprobs, forward(batch), rtol=1e-5, atol=1e-6)
  first = OfflineRollout(groups, prompts_per_step=2, seed=1, **shapes)
  first.collect()
  state = first.state()
  expected = first.collect().batch.tokens
  second = OfflineRollout(groups, prompts_per_step=2, seed=1, **shapes)
  second.restore(json.loads(json.dumps(state)))
  np.testing.assert_array_equal(second.collect().batch.tokens, expected)


@pytest.mark.slow
def test_best_of_n_and_qsharp_launchers(tmp_path):
  last_json(run("sft.py", "--config=configs/ppo.py:arith", f"--workdir={tmp_path}", *SMALL))
  common = ["--config=configs/ppo.py:arith", f"--workdir={tmp_path}", *SMALL,
            "--config.train.loggers=", "--config.data.num_eval=3"]
  result = run("best_of_n.py", *common, "--n=4", "--decision_tokens=2,4",
               "--rejection_rate=0.5", "--compare", "--bon_n=2")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert [(r["method"], r["n"]) for r in lines] == [
      ("speculative_rejection", 4), ("best_of_n", 4), ("best_of_n", 2)]
  # At most ⌊4/2⌋ then ⌊2/2⌋ per prompt (fewer when samples end before a decision).
  assert 0 < lines[0]["cancelled_samples"] <= 3 * (2 + 1)
  assert lines[0]["generated_tokens"] < lines[1]["generated_tokens"]
  assert all(0 <= r["accuracy"] <= 1 for r in lines)
  result = run("qsharp.py", *common, "--config.sampler.prompt_buckets=64,127", "--rounds=2",
               "--prompts_per_round=3", "--samples=2", "--steps=2", "--eval_samples=1",
               f"--output={tmp_path}/guide.npz")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert [r["policy"] for r in lines] == ["reference", "qsharp_eta0.1", "qsharp_eta0.1"]
  assert abs(lines[0]["kl_to_ref"]) < 1e-4 and lines[2]["rows"] == 12
  guide = np.load(f"{tmp_path}/guide.npz")
  assert guide["w"].shape[1] == guide["b"].shape[0] == 2 * TOKENIZER.vocab_size
  result = run("qsharp.py", *common, "--rounds=1")
  assert result.returncode != 0 and "sampler.prompt_buckets" in result.stderr
