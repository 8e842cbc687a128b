"""The trainer end to end on a shrunken arith config, and its pieces in isolation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.data import Example
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.training import trainer as trainer_lib
from tests.training.test_config_and_rollout import preset


def shrink(config):
  """Sizes for a CPU test: 1-layer 32-wide model, 3 SFT steps, 2 RL steps."""
  config.model.hidden_size, config.model.num_layers, config.model.num_heads = 32, 1, 2
  config.sft.steps, config.sft.batch_size = 3, 8
  config.data.num_train, config.data.num_eval = 64, 8
  config.rollout.prompts_per_step, config.rollout.max_new_tokens = 4, 96
  config.algorithm.group_size = 4
  config.algorithm.overlong_buffer = min(config.algorithm.overlong_buffer, 8)
  config.algorithm.value_pretrain_steps = min(config.algorithm.value_pretrain_steps, 1)
  config.sampler.num_slots, config.sampler.cache_length = 16, 64 + 96
  config.sampler.warmup = False
  config.train.steps, config.train.eval_every = 2, 2
  if config.algorithm.window_tokens:
    config.algorithm.window_tokens = 48  # T-PPO: two windows reach the cap.
  return config


def odd_length(response, answer):
  """A verifier with varied verdicts for an untrained model."""
  return len(response) % 2 == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "vcppo", "vapo", "tppo"])
def test_presets_run_end_to_end(name, tmp_path):
  config = shrink(preset(name))
  trainer = trainer_lib.Trainer(config, str(tmp_path), log=lambda line: None,
                                verifiers={"arith": odd_length})
  summary = trainer.run()
  assert summary["steps"] == 2 and 0 <= summary["eval_accuracy_end"] <= 1
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in records] == [0, 1, 2]
  critic = config.algorithm.estimator == "gae"
  # T-PPO's first step may finish no response (then it has no score metrics); by the
  # second every response has reached the cap.
  assert "reward_mean" in records[2]
  for record in records[1:]:
    keys = ("tokens_per_second", "time_generate", "time_update")
    if "reward_mean" in record:
      keys += ("reward_mean", "accuracy", "response_length_mean", "truncation_rate")
    for key in keys:
      assert np.isfinite(record[key]), key
    if record["actor_updated"]:
      for key in ("entropy", "grad_norm", "clip_frac_upper", "approx_kl",
                  "logprob_mismatch_max"):
        assert np.isfinite(record[key]), key
      assert record["skipped"] == 0
    if critic and "reward_mean" in record:
      assert np.isfinite(record["value_loss"]) and np.isfinite(record["explained_variance"])
  # Value pretraining (VC-PPO, VAPO): the first step trains the critic only.
  assert [r["actor_updated"] for r in records[1:]] == (
      [0.0, 1.0] if config.algorithm.value_pretrain_steps else [1.0, 1.0])
  if name == "grpo":
    # On-policy in float32: the sampler's log-probs are the trainer's (ratio 1 within 1e-5).
    assert records[1]["logprob_mismatch_max"] < 1e-5
    assert "kl_loss" in records[1]
  if name == "dapo":
    assert 0 < records[1]["kept_groups_ratio"] <= 1
  if name == "ppo":
    # The adaptive KL controller (Ziegler et al. 2019): β moves toward the target KL.
    a = config.algorithm
    first, second = records[1], records[2]
    assert first["kl_reward_coef"] == a.kl_reward_coef
    error = np.clip(first["rollout_kl"] / a.kl_target - 1, -0.2, 0.2)
    rows = config.rollout.prompts_per_step * a.group_size
    np.testing.assert_allclose(second["kl_reward_coef"],
                               a.kl_reward_coef * (1 + error * rows / a.kl_horizon), rtol=1e-6)


@pytest.mark.slow
def test_tppo_carries_unfinished_responses_across_steps(tmp_path):
  config = shrink(preset("tppo"))
  config.algorithm.window_tokens = 48
  config.rollout.stop_at_eos = False  # every response takes exactly two windows (96 tokens)
  config.train.steps, config.train.eval_every = 3, 3
  trainer = trainer_lib.Trainer(config, str(tmp_path), log=lambda line: None,
                                verifiers={"arith": odd_length})
  seen = []
  collect = trainer.collect_windows

  def spy():
    batch, info = collect()
    seen.append(batch)
    return batch, info

  trainer.collect_windows = spy
  trainer.run()
  rows = config.rollout.prompts_per_step * config.algorithm.group_size
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
  np.testing.assert_array_equal(second.old_logprobs[:, :48], first.old_logprobs[:, :48])
  # Step 3 starts fresh responses from new prompts.
  np.testing.assert_array_equal(third.window_starts, 0)
  assert not np.array_equal(third.tokens[:, :config.data.prompt_length],
                            first.tokens[:, :config.data.prompt_length])
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")][1:]
  assert [r["finished_responses"] for r in records] == [0, rows, 0]
  # No finished response, no value target: the critic trains in step 2 only.
  assert "value_loss" not in records[0] and "reward_mean" not in records[0]
  assert np.isfinite(records[1]["value_loss"]) and np.isfinite(records[1]["reward_mean"])
  # The continued window's log-probs (re-prefilled under new weights) are the trainer's.
  for record in records:
    assert record["logprob_mismatch_max"] < 1e-5


def group(correct):
  n = len(correct)
  return trainer_lib.Group(Example("q", "1", "arith"), [1], [[2]] * n, [[0.0]] * n,
                           [1.0 if c else -1.0 for c in correct], list(correct), [False] * n,
                           [""] * n)


class StubTrainer(trainer_lib.Trainer):
  """collect_groups without a model: each round returns the next scripted groups."""

  def __init__(self, config, rounds):
    self.config, self.algorithm = config, config.algorithm
    self.buffer = __import__("collections").deque()
    self.stream = type("S", (), {"take": lambda _, n: [None] * n})()
    self.rounds = list(rounds)

  def generate_groups(self, examples):
    return self.rounds.pop(0)


def test_dynamic_sampling_keeps_surplus_groups_for_the_next_step():
  config = preset("dapo")
  config.rollout.prompts_per_step = 2
  mixed, solved, failed = [True, False], [True, True], [False, False]
  stub = StubTrainer(config, [[group(solved), group(mixed)], [group(mixed), group(mixed)],
                              [group(failed), group(failed)]])
  kept, metrics = stub.collect_groups()
  assert len(kept) == 2 and len(stub.buffer) == 1
  assert metrics["kept_groups_ratio"] == 3 / 4 and metrics["generation_rounds"] == 2
  # The next step starts from the buffered group and needs one more.
  stub.rounds = [[group(failed), group(mixed)]]
  kept, _ = stub.collect_groups()
  assert len(kept) == 2 and not stub.buffer


def test_dynamic_sampling_gives_up_after_fruitless_rounds():
  config = preset("dapo")
  config.rollout.prompts_per_step = 2
  config.algorithm.max_generation_rounds = 3
  stub = StubTrainer(config, [[group([True, True])] * 2] * 3)
  with pytest.raises(trainer_lib.NoSignalError, match="max_generation_rounds=3"):
    stub.collect_groups()


def test_a_non_finite_update_is_skipped():
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  model, params = models.init_model(config, seed=0)
  algorithm = preset("grpo").algorithm
  optimizer = trainer_lib.make_optimizer(1e-2, 1, 0.0, 1.0)
  update = trainer_lib.build_actor_update(model, algorithm, optimizer)
  batch = rollout_lib.as_device(rollout_lib.build_rollout_batch(
      [[1, 2]] * 2, [[3, 4]] * 2, [[-1.0, -1.0]] * 2, [1.0, 0.0], [False] * 2, [0, 0],
      prompt_length=2, response_length=2, pad_id=0))
  state = trainer_lib.TrainState(params, optimizer.init(params))
  fine, metrics = update(state, batch, jnp.ones((2, 2)))
  assert metrics["skipped"] == 0
  assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.all(a == b)),
                                              fine.params, params)))
  broken, metrics = update(state, batch, jnp.full((2, 2), jnp.nan))
  assert metrics["skipped"] == 1
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), broken.params, params)


TIMING = ("elapsed_s", "tokens_per_second", "time_generate", "time_reward",
          "time_reference_critic", "time_update")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "tppo"])
def test_resume_continues_exactly(tmp_path, name):
  import shutil

  def config(steps):
    # GRPO has a KL loss: the reference is checkpointed too. T-PPO: a critic, and with
    # 32-token windows the step-2 checkpoint holds responses in flight.
    c = shrink(preset(name))
    if name == "tppo":
      c.algorithm.window_tokens = 32
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 2, 100
    return c

  straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
  straight = trainer_lib.Trainer(config(4), str(straight_dir), log=lambda line: None,
                                 verifiers={"arith": odd_length})
  straight.run()
  shutil.copytree(straight_dir / "sft", split_dir / "sft")

  class Killed(Exception):
    pass

  class DiesInStepFour(trainer_lib.Trainer):
    """Dies after step 3's metrics are written and before step 4's checkpoint."""

    def train_step(self):
      if self.step == 3:
        raise Killed()
      return super().train_step()

  with pytest.raises(Killed):
    DiesInStepFour(config(4), str(split_dir), log=lambda line: None,
                   verifiers={"arith": odd_length}).run()
  resumed = trainer_lib.Trainer(config(4), str(split_dir), log=lambda line: None,
                                verifiers={"arith": odd_length})
  assert resumed.step == 2  # the last checkpoint; step 3's metrics line is dropped
  if name == "tppo":
    assert any(t.tokens for t in resumed.windows.in_flight)  # restored mid-response
  resumed.run()

  def records(directory):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in open(directory / "metrics.jsonl")]

  assert records(split_dir) == records(straight_dir)
  jax.tree.map(np.testing.assert_array_equal, resumed.actor.params, straight.actor.params)
  jax.tree.map(np.testing.assert_array_equal, resumed.actor.opt_state,
               straight.actor.opt_state)
  jax.tree.map(np.testing.assert_array_equal, resumed.reference, straight.reference)
  if name == "tppo":
    assert resumed.windows.state() == straight.windows.state()
    jax.tree.map(np.testing.assert_array_equal, resumed.critic, straight.critic)



def read_event_scalars(directory):
  """(tag, step, value) of every scalar in the TFRecord event files of `directory`."""
  import struct

  from tensorboardX.proto import event_pb2

  out = []
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        out.append((value.tag, event.step, value.simple_value))
  return out


def test_metrics_also_go_to_tensorboard(tmp_path):
  writer = trainer_lib.Trainer.__new__(trainer_lib.Trainer)
  writer.config = preset("grpo")
  writer.workdir, writer.metrics_path = str(tmp_path), str(tmp_path / "metrics.jsonl")
  writer._tensorboard = None
  writer.write_metrics({"step": 1, "reward_mean": 0.5, "accuracy": 0.25})
  writer.write_metrics({"step": 2, "reward_mean": 0.75, "note": "text is skipped"})
  writer._tensorboard.close()  # run() closes it at the end
  assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1, 2]
  scalars = read_event_scalars(tmp_path / "tensorboard")
  assert sorted(scalars) == [("accuracy", 1, 0.25), ("reward_mean", 1, 0.5),
                             ("reward_mean", 2, 0.75)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "tppo"])
def test_training_against_a_sampling_server(tmp_path, name):
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.sampling import server as server_lib

  config = shrink(preset(name))
  config.algorithm.kl_loss_coef = 0.0
  config.data.num_eval = 12  # more prompts than server threads: the client windows them
  checkpoint = trainer_lib.ensure_sft_checkpoint(config, str(tmp_path), log=lambda line: None)
  model, params = models.load_hf_checkpoint(checkpoint)
  # The server starts from other weights: the trainer must push its own before sampling.
  _, other = models.init_model(model.config, seed=99)
  scheduler = sampler_config_lib.build_scheduler(config.sampler, model, other)
  server, port, service = server_lib.start_server(scheduler, port=0, max_workers=4)
  try:
    config.sampler.address = f"localhost:{port}"
    trainer = trainer_lib.Trainer(config, str(tmp_path), log=lambda line: None,
                                  verifiers={"arith": odd_length})
    trainer.sampler.max_in_flight = 3  # below the server's 4 handler threads
    summary = trainer.run()
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert summary["steps"] == 2
    # The server sampled with the trainer's weights: ratio 1 on the first mini-batch
    # (for T-PPO also in step 2, whose windows continue step 1's responses).
    for record in records[1:]:
      assert record["logprob_mismatch_max"] < 1e-5
    assert service.scheduler.weights_version == 2
  finally:
    server.stop(grace=None)
    service.stop()
