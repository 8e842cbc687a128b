"""Bounded-staleness pipelining (rollout/pipelined.py, sampling/versioned.py): which
weights each batch samples with, checkpoints of the batches in flight, and a Trainer
with generation one version ahead (k = 1) that learns and resumes exactly."""

import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.rewards import RewardRouter
from rlhf_jax.rollout.lookahead import LookAhead
from rlhf_jax.rollout.pipelined import PipelinedRollout
from rlhf_jax.rollout.pipelined import decode_job
from rlhf_jax.rollout.pipelined import encode_job
from rlhf_jax.sampling.versioned import VersionedSampler
from tests.rollout.scripted_groups import group
from tests.rollout.scripted_groups import MIXED
from rlhf_jax.rollout import pack_groups


class RecordingSampler:
  """Holds one weights version; records the version of every generate call."""

  def __init__(self):
    self.version, self.calls, self.threads = 0, [], set()

  def update_params(self, params, version):
    self.version = version

  def generate(self, prompts, sampling):
    self.calls.append(self.version)
    self.threads.add(threading.current_thread().name)
    return [[self.version] for _ in prompts]


class CountingScorer:
  def __init__(self):
    self.scored = 0

  def pop_metrics(self):
    scored, self.scored = self.scored, 0
    return {"scored": float(scored)}


class StepRollout:
  """An inner rollout whose batch n records the version that sampled it."""

  def __init__(self, sampler, scorer):
    self.sampler, self.scorer, self.step, self.position = sampler, scorer, None, 0

  def set_step(self, step):
    self.step = step

  def collect(self):
    version = self.sampler.generate([[1]], None)[0][0]
    self.scorer.scored += 1
    self.position += 1
    rollouts = pack_groups([group(MIXED, version)], prompt_length=4, response_length=8,
                           pad_id=0)
    rollouts.metrics.update(step=float(self.step), version=float(version))
    return rollouts

  def pop_mix(self):
    return {"arith": 1}

  def state(self):
    return {"position": self.position}

  def restore(self, state):
    self.position = state["position"]

  def close(self):
    self.closed = True


def pipeline(k, steps, start=0, state=None):
  """Runs the loop's calls for `steps` steps over the rollout the plan of k builds;
  returns (versions per batch, rollout, the sampler the versions record)."""
  inner_sampler, scorer = RecordingSampler(), CountingScorer()
  inner_sampler.version = start  # a resumed run's sampler holds the restored weights
  sampler = VersionedSampler(inner_sampler, {"w": jnp.zeros(2)}, version=start, keep=k + 1)
  rollout = LookAhead(steps=k).rollout(StepRollout(sampler, scorer), sampler, scorer)
  if state is not None:
    rollout.restore(json.loads(json.dumps(state)))
  versions = []
  for step in range(start, start + steps):
    rollout.set_step(step)
    got = rollout.collect()
    assert got.metrics["step"] == step and got.metrics["scored"] == 1
    assert rollout.pop_mix() == {"arith": 1}
    versions.append(int(got.metrics["version"]))
    sampler.update_params({"w": jnp.full(2, step + 1.0)}, version=step + 1)  # the push
  return versions, rollout, inner_sampler


@pytest.mark.parametrize("k, expected", [(0, [0, 1, 2, 3, 4]), (1, [0, 0, 1, 2, 3]),
                                         (2, [0, 0, 0, 1, 2])])
def test_batch_n_samples_with_version_n_minus_k(k, expected):
  versions, rollout, inner = pipeline(k, 5)
  assert versions == expected
  # Generation ran on the worker thread when k > 0, inline when k = 0: the mode's own
  # collect, with no pipeline around it.
  assert isinstance(rollout, PipelinedRollout) == (k > 0)
  assert inner.threads == ({"MainThread"} if k == 0 else {n for n in inner.threads
                                                          if n.startswith("rollout")})
  rollout.close()


def test_a_restored_pipeline_continues_with_the_same_batches():
  whole, _, _ = pipeline(2, 6)
  first, rollout, _ = pipeline(2, 3)
  state = rollout.state()  # waits for batches 3 and 4, already sampled (versions 1, 2)
  assert sorted(state["pending"]) == ["3", "4"] and state["inner"] == {"position": 5}
  rest, _, _ = pipeline(2, 3, start=3, state=state)
  assert first + rest == whole


def test_synchronous_state_is_the_inner_state():
  _, rollout, _ = pipeline(0, 2)
  assert rollout.state() == {"position": 2}


@pytest.mark.parametrize("k", [0, 1])
def test_closing_the_pipeline_closes_the_inner_rollout(k):
  """The inner rollout's workers (a multi-turn run's environments) stop with the run."""
  _, rollout, _ = pipeline(k, 2)
  assert not hasattr(rollout.inner, "closed")
  rollout.close()
  assert rollout.inner.closed


def test_job_encoding_is_bit_exact():
  rollouts = pack_groups([group(MIXED, 3), group(MIXED, 1)], prompt_length=4,
                         response_length=8, pad_id=0)
  rollouts.batch = rollouts.batch.replace(sampler_logprobs=np.float32(np.pi) * rollouts.batch.
                                          sampler_logprobs + np.float32(1e-7))
  rollouts.metrics["x"] = 0.125
  rollouts.transcripts = [[{"role": "assistant", "text": "7", "token_ids": [5]},
                           {"role": "environment", "text": "ok", "token_ids": [6, 7]}]]
  from rlhf_jax.rollout.pipelined import _Job
  encoded = json.loads(json.dumps(encode_job(_Job(rollouts, {"arith": 2}))))
  back = decode_job(encoded)
  for name in ("tokens", "sampler_logprobs", "token_versions", "finished", "scores"):
    a, b = np.asarray(getattr(rollouts.batch, name)), getattr(back.rollouts.batch, name)
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
  assert back.rollouts.batch.ref_logprobs is None  # none came with the rollout
  # A job stored before the batch split also holds the fields `prepare` sets, as nothing
  # had set them: the rollout's fields come back, those are dropped.
  encoded["batch"]["advantages"] = encoded["batch"]["sampler_logprobs"]
  old = decode_job(encoded).rollouts.batch
  assert type(old) is type(rollouts.batch) and not hasattr(old, "advantages")
  assert back.rollouts.correct == rollouts.correct and back.mix == {"arith": 2}
  assert back.rollouts.metrics == {"x": 0.125}
  assert back.rollouts.transcripts == rollouts.transcripts  # multi-turn rows' turns


def test_versioned_sampler_keeps_copies_of_the_newest_versions():
  inner = RecordingSampler()
  sampler = VersionedSampler(inner, {"w": jnp.zeros(2)}, keep=2)
  params = {"w": jnp.ones(2)}
  sampler.update_params(params, version=1)
  params["w"].delete()  # the learner donates its buffers at its next update
  sampler.update_params({"w": jnp.full(2, 2.0)}, version=2)
  assert sorted(sampler.versions) == [1, 2] and float(sampler.versions[1]["w"][0]) == 1.0
  with sampler.pinned(0):
    with pytest.raises(KeyError, match="version 0 is no longer kept"):
      sampler.generate([[1]], None)
  with sampler.pinned(1):
    sampler.generate([[1]], None)
  sampler.generate([[1]], None)  # unpinned: the newest
  assert inner.calls == [1, 2]


class LiveSampler:
  """A wrapped sampler whose generation is still running when new weights arrive."""

  def __init__(self, reply=None):
    self.loaded, self.reply = [], reply
    self.generating, self.updated = threading.Event(), threading.Event()

  def update_params(self, params, version):
    self.loaded.append((version, float(params["w"][0])))
    self.updated.set()
    return self.reply

  def generate(self, prompts, sampling):
    self.generating.set()
    assert self.updated.wait(10), "the new weights did not reach the running generation"
    return [["done"] for _ in prompts]


def test_partial_rollouts_hand_new_weights_to_the_generation_in_flight():
  inner = LiveSampler()
  sampler = VersionedSampler(inner, {"w": jnp.zeros(2)}, keep=2, partial=True)
  out = []
  worker = threading.Thread(target=lambda: out.append(sampler.generate([[1]], None)))
  worker.start()
  assert inner.generating.wait(10)
  params = {"w": jnp.ones(2)}
  sampler.update_params(params, version=1)  # returns while the generation still runs
  params["w"].delete()  # the learner donates its buffers: the sampler got a copy
  worker.join(10)
  assert out == [[["done"]]] and inner.loaded == [(1, 1.0)] and sampler.loaded == 1


def test_partial_rollouts_refuse_a_server_that_finishes_old_samples_first():
  import types
  inner = LiveSampler(reply=types.SimpleNamespace(update_policy="finish_old"))
  sampler = VersionedSampler(inner, {"w": jnp.zeros(2)}, keep=2, partial=True)
  with pytest.raises(ValueError, match="sampler.update_policy='swap_now'.*'finish_old'"):
    sampler.update_params({"w": jnp.ones(2)}, version=1)
  # a fleet answers for each of its servers
  inner.reply = [types.SimpleNamespace(update_policy="swap_now"),
                 types.SimpleNamespace(update_policy="finish_old")]
  with pytest.raises(ValueError, match=r"found \['finish_old'\]"):
    sampler.update_params({"w": jnp.ones(2)}, version=2)
  inner.reply = [types.SimpleNamespace(update_policy="swap_now")] * 2
  sampler.update_params({"w": jnp.ones(2)}, version=3)
  assert sampler.loaded == 3


@pytest.mark.parametrize("changes, field", [
    ({"rollout.partial_rollouts": True}, "rollout.partial_rollouts"),
    ({"rollout.partial_rollouts": True, "rollout.max_staleness": 1},
     "sampler.update_policy"),
])
def test_partial_rollout_settings_are_named(changes, field):
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.training.config import validate_config
  from tests.training.runs import preset
  config = preset("grpo")
  for key, value in changes.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(ConfigError, match=f"config.{field}"):
    validate_config(config, 1)


def short_response(response, answer):
  """A reward a 1-layer model learns in a few steps: stop early."""
  return len(response) <= 20


def async_trainer(workdir, steps, partial=False):
  from rlhf_jax.training import loop
  from rlhf_jax.training import stages
  from tests.training.runs import preset
  from tests.training.runs import shrink
  config = shrink(preset("grpo"))
  config.rollout.max_staleness = 1
  if partial:
    config.rollout.partial_rollouts, config.sampler.update_policy = True, "swap_now"
  config.train.steps, config.train.eval_every, config.train.checkpoint_every = steps, 100, 2
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 2e-3, 1
  config.train.loggers = ""
  stages.ensure_arith_warm_start(config, str(workdir), log=lambda line: None)
  scorer = RewardRouter({"arith": short_response}, correct_score=1.0, wrong_score=0.0)
  return loop.Trainer(config, str(workdir), log=lambda line: None, scorer=scorer)


def training_records(workdir):
  return [json.loads(line) for line in open(workdir / "metrics.jsonl")
          if "reward_mean" in json.loads(line)]


@pytest.mark.slow
def test_one_step_ahead_learns_and_corrects_its_stale_tokens(tmp_path):
  async_trainer(tmp_path, steps=8).run()
  records = training_records(tmp_path)
  assert [r["step"] for r in records] == list(range(1, 9))
  # Batch 0 is the starting policy's own; every later batch is one version old.
  assert records[0]["staleness/stale_token_fraction"] == 0
  for r in records[1:]:
    assert r["staleness/stale_token_fraction"] == 1 and r["staleness/mean_version_lag"] == 1
  rewards = [r["reward_mean"] for r in records]
  assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.2, rewards


@pytest.mark.slow
def test_partial_rollouts_learn_with_every_token_at_most_one_version_old(tmp_path):
  """Where the weights switch under a sample follows the threads' timing: the bounds
  hold whatever it was."""
  async_trainer(tmp_path, steps=6, partial=True).run()
  records = training_records(tmp_path)
  assert [r["step"] for r in records] == list(range(1, 7))
  for r in records:
    assert 0 <= r["staleness/mean_version_lag"] <= r["staleness/max_version_lag"] <= 1
    assert 0 <= r["staleness/mixed_version_row_fraction"] <= 1
    assert np.isfinite(r["loss"])
  rewards = [r["reward_mean"] for r in records]
  assert np.mean(rewards[-2:]) > np.mean(rewards[:2]), rewards


@pytest.mark.slow
def test_an_async_run_resumes_exactly(tmp_path):
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  whole = async_trainer(straight, steps=4)
  whole.run()
  first = async_trainer(resumed, steps=4)
  for _ in range(2):
    first.metrics.write(first.train_step())
  first.save()  # step 2, with batch 2 (sampled by version 1) generated ahead
  first.close()  # the process ends here (and its workdir lock with it)
  again = async_trainer(resumed, steps=4)
  assert again.step == 2 and sorted(again.rollout.pending) == [2]
  again.run()
  keys = ("reward_mean", "response_length_mean", "loss", "grad_norm", "entropy",
          "staleness/mean_version_lag")
  assert ([[r[k] for k in keys] for r in training_records(resumed)]
          == [[r[k] for k in keys] for r in training_records(straight)])
  # The last step submits nothing beyond train.steps: nothing is left in flight.
  assert again.rollout.pending == {} and again.rollout.next_job == 4
  for a, b in zip(jax.tree.leaves(again.learner.policy_params),
                  jax.tree.leaves(whole.learner.policy_params)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


class FailingRollout(StepRollout):
  def __init__(self, sampler, scorer, fail_at):
    super().__init__(sampler, scorer)
    self.fail_at = fail_at

  def collect(self):
    if self.step == self.fail_at:
      raise RuntimeError("no group with a learning signal")
    return super().collect()


def test_a_failed_job_ends_the_checkpointed_batches_and_surfaces_at_its_step():
  inner_sampler, scorer = RecordingSampler(), CountingScorer()
  sampler = VersionedSampler(inner_sampler, {"w": jnp.zeros(2)}, keep=3)
  rollout = PipelinedRollout(FailingRollout(sampler, scorer, fail_at=3), sampler, scorer,
                             max_staleness=2)
  for step in range(2):  # submits jobs 0-3; job 3 fails on the worker thread
    rollout.set_step(step)
    rollout.collect()
    sampler.update_params({"w": jnp.ones(2)}, version=step + 1)
  state = rollout.state()  # the checkpoint is still written
  assert sorted(state["pending"]) == ["2"] and state["next_job"] == 3
  assert state["inner"] == {"position": 3}  # after job 2: job 3 is generated again
  rollout.set_step(2)
  rollout.collect()
  rollout.set_step(3)
  with pytest.raises(RuntimeError, match="learning signal"):
    rollout.collect()
  rollout.close()


def test_checkpoints_go_from_synchronous_to_ahead_but_not_back():
  from rlhf_jax.config_errors import ConfigError
  _, synchronous, _ = pipeline(0, 2)
  versions, _, _ = pipeline(1, 2, start=2, state=synchronous.state())
  assert versions == [2, 2]  # nothing was ahead: batch 2 is sampled at step 2
  _, ahead, _ = pipeline(1, 2)
  with pytest.raises(ConfigError, match="rollout.max_staleness.*1 batches generated ahead"):
    pipeline(0, 1, start=2, state=ahead.state())
