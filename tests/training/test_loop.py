"""The training loop (training/loop.py) end to end on a shrunken arith config."""

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import batch as batch_lib
from rlhf_jax.training import loop
from rlhf_jax.training import stages
from rlhf_jax.rollout.pipelined import PipelinedRollout
from tests.training.runs import TIMING
from tests.training.runs import make_trainer
from tests.training.runs import preset
from tests.training.runs import records
from tests.training.runs import scorer
from tests.training.runs import shrink


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "vcppo", "vapo", "tppo", "gspo",
                                  "cispo"])
def test_presets_run_end_to_end(name, tmp_path):
  config = shrink(preset(name))
  trainer = make_trainer(config, tmp_path)
  # k = 0: the loop runs the rollout mode inline, with no pipeline (and no thread) around it.
  assert not isinstance(trainer.rollout, PipelinedRollout)
  summary = trainer.run()
  assert summary["steps"] == 2 and 0 <= summary["eval_accuracy_end"] <= 1
  logged = records(tmp_path)
  assert [r["step"] for r in logged] == [0, 1, 2]
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  for record in logged[1:]:  # the scorer's count of each batch's own scoring
    if "reward_mean" in record:
      samples = record["reward/arith/samples"]
      if name == "tppo":  # the responses that finished in this step's windows
        assert samples == record["finished_responses"]
      else:  # DAPO samples groups beyond the batch's
        assert samples >= rows if name == "dapo" else samples == rows
  critic = config.algorithm.advantage.estimator == "gae"
  # T-PPO's first step may finish no response (then it has no score metrics); by the
  # second every response has reached the cap.
  assert "reward_mean" in logged[2]
  for record in logged[1:]:
    keys = ("tokens_per_second", "time_generate", "time_update", "logprob_mismatch_max",
            "logprob_mismatch_mean", "is_ratio_min", "is_ratio_max")
    if "reward_mean" in record:
      keys += ("reward_mean", "accuracy", "response_length_mean", "truncation_rate")
    for key in keys:
      assert np.isfinite(record[key]), key
    # float32 sampler and trainer: π_old is the sampler's within float32 rounding (the
    # whole batch is compared in `prepare`). Every preset trains on-policy rows only
    # (dynamic sampling discards its surplus; T-PPO trains a window in its own step).
    assert record["logprob_mismatch_max"] < 1e-5
    assert record["staleness/stale_token_fraction"] == 0
    if record["actor_updated"]:
      for key in ("entropy", "grad_norm", "clip_frac_upper", "approx_kl"):
        assert np.isfinite(record[key]), key
      assert record["skipped"] == 0
    if critic and "reward_mean" in record:
      assert np.isfinite(record["value_loss"]) and np.isfinite(record["explained_variance"])
  # Value pretraining (VC-PPO, VAPO): the first step trains the critic only.
  assert [r["actor_updated"] for r in logged[1:]] == (
      [0.0, 1.0] if config.algorithm.value.pretrain_steps else [1.0, 1.0])
  if name == "grpo":
    assert "kl_loss" in logged[1]
  if name == "dapo":
    assert 0 < logged[1]["kept_groups_ratio"] <= 1
  if name == "ppo":
    # The adaptive KL controller (Ziegler et al. 2019): β moves toward the target KL.
    kl = config.algorithm.kl
    first, second = logged[1], logged[2]
    np.testing.assert_allclose(first["kl_reward_coef"], kl.coef, rtol=1e-6)
    error = np.clip(first["rollout_kl"] / kl.target - 1, -0.2, 0.2)
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    np.testing.assert_allclose(second["kl_reward_coef"],
                               kl.coef * (1 + error * rows / kl.horizon), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("keep_surplus", [False, True])
def test_dapo_fresh_rows_match_the_sampler_at_every_step(tmp_path, keep_surplus):
  """The sampler–trainer mismatch is measured on fresh rows only, and stays at float32
  rounding in every step; with keep_surplus the reused groups are stale rows whose
  version lag and log-prob gap (the policy moved since) are reported apart."""
  config = shrink(preset("dapo"))
  config.rollout.dynamic.keep_surplus = keep_surplus
  config.rollout.dynamic.max_age = 1
  config.train.steps, config.train.eval_every = 3, 3
  make_trainer(config, tmp_path).run()
  logged = records(tmp_path)[1:]
  for record in logged:
    assert record["logprob_mismatch_max"] < 1e-5, record["step"]
    assert record["reused_group_age_max"] <= 1
  stale = [r for r in logged if r["staleness/stale_token_fraction"] > 0]
  if not keep_surplus:
    assert not stale and all(r["reused_groups"] == 0 for r in logged)
    assert sum(r["discarded_surplus_groups"] for r in logged) > 0
    return
  assert stale and all(r["reused_groups"] > 0 for r in stale)
  for record in stale:
    assert record["staleness/mean_version_lag"] > 0 and record["staleness/max_version_lag"] == 1
    assert record["staleness/stale_logprob_gap_max"] > 1e-4  # one update of the policy
    assert record["staleness/weight_min"] <= 1 <= record["staleness/weight_max"]


@pytest.mark.slow
def test_tppo_carries_unfinished_responses_across_steps(tmp_path):
  config = shrink(preset("tppo"))
  config.rollout.stop_at_eos = False  # every response takes exactly two windows (96 tokens)
  config.train.steps, config.train.eval_every = 3, 3
  trainer = make_trainer(config, tmp_path)
  seen = []
  collect = trainer.rollout.collect

  def spy():
    rollouts = collect()
    seen.append(rollouts.batch)
    return rollouts

  trainer.rollout.collect = spy
  trainer.run()
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  first, second, third = seen
  assert first.tokens.shape[0] == second.tokens.shape[0] == third.tokens.shape[0] == rows
  # Step 1: every response is cut after 48 tokens; step 2 continues the same responses
  # (same prompt and first window) under the updated policy and finishes them at the cap.
  np.testing.assert_array_equal(first.window_starts, 0)
  np.testing.assert_array_equal(first.lengths, 48)
  assert not first.finished.any()
  np.testing.assert_array_equal(second.window_starts, 48)
  np.testing.assert_array_equal(second.lengths, 96)
  assert second.finished.all() and second.truncated.all()
  prefix = config.data.prompt_length + 48
  np.testing.assert_array_equal(second.tokens[:, :prefix], first.tokens[:, :prefix])
  np.testing.assert_array_equal(second.sampler_logprobs[:, :48],
                                first.sampler_logprobs[:, :48])
  # Step 3 starts fresh responses from new prompts.
  np.testing.assert_array_equal(third.window_starts, 0)
  assert not np.array_equal(third.tokens[:, :config.data.prompt_length],
                            first.tokens[:, :config.data.prompt_length])
  logged = records(tmp_path)[1:]
  assert [r["finished_responses"] for r in logged] == [0, rows, 0]
  # No finished response, no value target: the critic trains in step 2 only.
  assert "value_loss" not in logged[0] and "reward_mean" not in logged[0]
  assert np.isfinite(logged[1]["value_loss"]) and np.isfinite(logged[1]["reward_mean"])
  # The continued window's log-probs (re-prefilled under new weights) are the trainer's.
  for record in logged:
    assert record["logprob_mismatch_max"] < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "tppo"])
def test_resume_continues_exactly(tmp_path, name):
  import shutil

  def config(steps):
    # GRPO has a KL loss: the reference is checkpointed too. T-PPO: a critic, and with
    # 32-token windows the step-2 checkpoint holds responses in flight.
    c = shrink(preset(name))
    c.rollout.windows.window_tokens = 32
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 2, 100
    return c

  straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
  straight = make_trainer(config(4), straight_dir)
  straight.run()
  shutil.copytree(straight_dir / "sft", split_dir / "sft")

  class Killed(Exception):
    pass

  class DiesInStepFour(loop.Trainer):
    """Dies after step 3's metrics are written and before step 4's checkpoint."""

    def train_step(self):
      if self.step == 3:
        raise Killed()
      return super().train_step()

  with pytest.raises(Killed):
    DiesInStepFour(config(4), str(split_dir), log=lambda line: None,
                   scorer=scorer(config(4))).run()
  resumed = make_trainer(config(4), split_dir)
  assert resumed.step == 2  # the last checkpoint; step 3's metrics line is dropped
  if name == "tppo":
    assert any(t.tokens for t in resumed.rollout.inner.pool.in_flight)  # restored mid-response
  resumed.run()

  def timeless(directory):
    return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("time_")} for r in records(directory)]

  assert timeless(split_dir) == timeless(straight_dir)
  jax.tree.map(np.testing.assert_array_equal, resumed.learner.state(), straight.learner.state())
  assert resumed.rollout.state() == straight.rollout.state()
  if name == "grpo":  # died before its first checkpoint: a fresh start drops its records
    stale = tmp_path / "stale"
    shutil.copytree(straight_dir / "sft", stale / "sft")
    (stale / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 9.0}\n')
    assert make_trainer(config(4), stale).step == 0 and records(stale) == []


@pytest.mark.slow
def test_bf16_sampler_is_corrected_by_truncated_importance_sampling(tmp_path):
  """A bfloat16 sampler under a float32 trainer: π_old is the trainer's recomputation,
  the mismatch is measured, and the loss weights are min(π_trainer / π_sampler, C)."""
  config = shrink(preset("grpo"))
  config.sampler.dtype = "bfloat16"
  config.algorithm.correction.threshold = 1.0001  # a small C, so that truncation happens
  config.train.steps = 1
  trainer = make_trainer(config, tmp_path)
  assert trainer.learner.correction == "tis"  # 'auto' with differing dtypes
  captured = {}
  prepare = trainer.learner._prepare

  def spy(actor_params, *args):
    # The trainer's own float32 forward, independent of `prepare`, before any update.
    batch = args[-2]  # (..., version, batch, packed)
    captured["recomputed"] = np.asarray(batch_lib.response_logprobs(
        trainer.learner.actor.model, actor_params, batch))
    out = prepare(actor_params, *args)
    captured["batch"] = jax.device_get(out[0])
    return out

  trainer.learner._prepare = spy
  metrics = trainer.train_step()
  batch = captured["batch"]
  mask = np.asarray(batch.response_mask)
  old, sampled = np.asarray(batch.old_logprobs), np.asarray(batch.sampler_logprobs)
  np.testing.assert_allclose(old, captured["recomputed"] * mask, atol=1e-6)
  gap = np.abs(old - sampled) * mask
  assert gap.max() > 1e-4  # bf16 sampling is measurably off-policy ...
  np.testing.assert_allclose(metrics["logprob_mismatch_max"], gap.max(), rtol=1e-5)
  np.testing.assert_allclose(metrics["logprob_mismatch_mean"], gap.sum() / mask.sum(),
                             rtol=1e-4)
  ratio = np.exp(old - sampled)
  expected = np.minimum(ratio, 1.0001) * mask  # TIS (Yao et al. 2025)
  np.testing.assert_allclose(np.asarray(batch.is_weights), expected, rtol=1e-5, atol=1e-7)
  clipped = ((ratio > 1.0001) * mask).sum() / mask.sum()
  assert clipped > 0  # ... and C = 1.0001 truncates some tokens
  np.testing.assert_allclose(metrics["correction_clipped_frac"], clipped, rtol=1e-5)
  np.testing.assert_allclose(metrics["is_ratio_max"], ratio[mask > 0].max(), rtol=1e-5)
  np.testing.assert_allclose(metrics["is_ratio_min"], ratio[mask > 0].min(), rtol=1e-5)


def test_metrics_also_go_to_tensorboard(tmp_path):
  from rlhf_jax.training.loggers import TensorBoardLogger
  from rlhf_jax.training.metrics import MetricsWriter
  from tests.training.tensorboard_events import read_event_scalars

  writer = MetricsWriter(str(tmp_path), [TensorBoardLogger(str(tmp_path), None)])
  writer.write({"step": 1, "reward_mean": 0.5, "accuracy": 0.25})
  writer.write({"step": 2, "reward_mean": 0.75, "note": "text is skipped"})
  writer.close()
  assert [r["step"] for r in records(tmp_path)] == [1, 2]
  scalars = read_event_scalars(tmp_path / "tensorboard")
  assert sorted(scalars) == [("accuracy", 1, 0.25), ("reward_mean", 1, 0.5),
                             ("reward_mean", 2, 0.75)]
  writer.truncate_after(1)
  assert [r["step"] for r in records(tmp_path)] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("name, servers, staleness", [("grpo", 1, 0), ("tppo", 1, 0),
                                                       ("grpo", 2, 0), ("grpo", 2, 1)])
def test_training_against_sampling_servers(tmp_path, name, servers, staleness):
  """One server (`sampler.address`) or a fleet of two (`sampler.addresses`), also with
  generation one version ahead (the servers get each job's pinned weights) and the
  servers scoring the reference log-probs of the KL term."""
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.sampling.serve import server as server_lib

  config = shrink(preset(name))
  from_sampler = staleness > 0  # the KL term's reference on the servers
  if from_sampler:
    config.rollout.reference_logprobs = "sampler"
  else:
    config.algorithm.kl.placement, config.algorithm.kl.coef = "none", 0.0
  config.data.num_eval = 12  # more prompts than server threads: the client windows them
  config.rollout.max_staleness = staleness
  checkpoint = stages.ensure_arith_warm_start(config, str(tmp_path), log=lambda line: None)
  model, params = models.load_hf_checkpoint(checkpoint)
  # The servers start from other weights: the trainer must push its own before sampling.
  _, other = models.init_model(model.config, seed=99)
  # The servers get the sizes the trainer's run derives (a server's own config gives them).
  from rlhf_jax.training.sections import fit_sampler_sizes  # pylint: disable=import-outside-toplevel
  fit_sampler_sizes(config)
  started = [server_lib.start_server(sampler_config_lib.build_scheduler(
      config.sampler, model, other), port=0, max_workers=4) for _ in range(servers)]
  addresses = tuple(f"localhost:{port}" for _, port, _ in started)
  try:
    if servers == 1:
      config.sampler.address = addresses[0]
    else:
      config.sampler.addresses = addresses
    trainer = make_trainer(config, tmp_path)
    fleet = getattr(trainer.sampler, "inner", trainer.sampler)  # under a VersionedSampler
    fleet.max_in_flight = 3  # below each server's 4 handler threads
    summary = trainer.run()
    assert summary["steps"] == 2
    if from_sampler:  # no copy on the trainer; the servers' reference is the warm start
      assert trainer.learner.reference is None
      first = next(r for r in records(tmp_path) if r["step"] == 1 and "kl_loss" in r)
      assert first["kl_loss"] < 1e-4  # the policy is the reference (other weights: nats)
      assert first["time_reference"] > 0
    # The servers sampled with the trainer's weights: ratio 1 in every step (for T-PPO
    # also in step 2, whose windows continue step 1's responses).
    for record in records(tmp_path)[1:]:
      if staleness:  # step 2 trains on tokens of version 1: stale, corrected
        assert record["staleness/mean_version_lag"] == (record["step"] > 1)
      else:
        assert record["logprob_mismatch_max"] < 1e-5
    for _, _, service in started:
      assert service.scheduler.weights_version == 2
      assert service.metrics()["requests_completed"] > 0
  finally:
    for server, _, service in started:
      server.stop(grace=None)
      service.stop()


def test_the_trainer_needs_a_policy_checkpoint(tmp_path):
  from rlhf_jax.config_errors import ConfigError
  with pytest.raises(ConfigError, match=r"config\.model\.checkpoint: no policy checkpoint"):
    loop.Trainer(shrink(preset("grpo")), str(tmp_path), log=lambda line: None)


@pytest.mark.slow
def test_lora_adapters_and_packed_rows_train_end_to_end(tmp_path):
  """PPO (actor, critic, reference) training LoRA adapters on packed rows, with the
  layers scanned and the log-probs chunked: the sampler's log-probs are recomputed from
  the packed forward to float32 rounding, only the adapters (and the value head) move,
  and the sampler is sent the merged weights."""
  config = shrink(preset("ppo"))
  config.model.lora_rank, config.model.lora_alpha = 4, 8.0
  config.model.scan_layers, config.model.remat, config.model.logprob_chunk = True, True, 32
  config.model.num_layers = 2
  config.train.packing = True
  trainer = make_trainer(config, tmp_path)
  base = jax.tree.map(np.asarray, trainer.learner.actor.params["base"])
  adapters = jax.tree.map(np.asarray, trainer.learner.actor.params["adapters"])
  trainer.run()
  logged = records(tmp_path)[1:]
  for record in logged:
    assert record["logprob_mismatch_max"] < 1e-5
    assert (record["packing/padding_fraction_prepare"]
            < record["packing/padding_fraction_padded"])
    assert record["sampler/push_bytes"] == sum(
        x.nbytes for x in jax.tree.leaves(trainer.learner.policy_params))
  actor = trainer.learner.actor.params
  jax.tree.map(np.testing.assert_array_equal, actor["base"], base)
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b),
                                       actor["adapters"], adapters))
  assert any(moved)
  merged = trainer.learner.policy_params
  assert jax.tree.structure(merged) == jax.tree.structure(base)
  assert not np.array_equal(np.asarray(merged["layers"]["attention"]["q_proj"]),
                            base["layers"]["attention"]["q_proj"])  # stacked [L, ...]
