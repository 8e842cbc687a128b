"""Reference log-probs from the sampling servers (rollout/reference.py), with a scripted
rollout and reference sampler: when `rollout.reference_logprobs='sampler'` can hold, the
servers' dtype checked when the weights are sent, and batches that carry the servers' log-probs
(the servers' own forward is the sampling tests')."""

from __future__ import annotations

import types

import numpy as np
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rollout import reference
from tests.fakes import FakeRollout
from tests.fakes import FakeSampler
from tests.training.runs import preset


def sampler_reference_config(**algorithm_kl):
  c = preset("grpo")
  c.rollout.reference_logprobs = "sampler"
  for name, value in algorithm_kl.items():
    c.algorithm.kl[name] = value
  return c


@pytest.mark.parametrize("change, options, message", [
    ({}, dict(remote=False), "needs sampling servers"),
    ({}, dict(sampler_reference=False), "is for the PPO family's learner on sampled rollouts"),
    ({}, dict(uses_reference=False), "needs a reference: algorithm.kl.placement is 'none'"),
    ({"reference_ema": 0.1}, {}, "needs a frozen reference; algorithm.kl.reference_ema=0.1"),
])
def test_when_the_servers_cannot_compute_the_reference(change, options, message):
  c = sampler_reference_config(**change)
  kwargs = dict(uses_reference=True, remote=True, sampler_reference=True) | options
  with pytest.raises(ConfigError, match=rf"^config\.rollout\.reference_logprobs: invalid "
                                        rf"value 'sampler': {message}"):
    reference.check_config(c, **kwargs)


def test_the_servers_dtype_and_the_places():
  c = sampler_reference_config()
  reference.check_config(c, uses_reference=True, remote=True, sampler_reference=True)
  assert reference.from_sampler(c)
  c.sampler.dtype, c.model.dtype = "bfloat16", "float32"
  with pytest.raises(ConfigError, match=r"needs sampler\.dtype == model\.dtype"):
    reference.check_config(c, uses_reference=True, remote=True, sampler_reference=True)
  c.rollout.reference_logprobs = "trainer"  # nothing else to check
  reference.check_config(c, uses_reference=False, remote=False, sampler_reference=False)
  assert not reference.from_sampler(c)
  c.rollout.reference_logprobs = "nowhere"
  with pytest.raises(ConfigError, match=r"must be one of trainer, sampler"):
    reference.check_config(c, uses_reference=True, remote=True, sampler_reference=True)


class ReferenceServers:
  """Replies to `update_reference` with each server's compute dtype, and gives reference
  log-probs of its rows (−position on response tokens) or of a wrong shape."""

  def __init__(self, dtypes=("float32",), wrong_shape=False):
    self.dtypes, self.wrong_shape, self.sent = dtypes, wrong_shape, None

  def update_reference(self, params):
    self.sent = params
    return [types.SimpleNamespace(compute_dtype=d) for d in self.dtypes]

  def reference_logprobs(self, tokens, attention_mask, response_mask):
    mask = np.asarray(response_mask, np.float32)
    if self.wrong_shape:
      return mask[:, :-1]
    return -np.cumsum(mask, axis=1) * mask


def test_the_weights_go_to_servers_of_the_trainers_dtype():
  servers = ReferenceServers(("float32", "float32"))
  reference.send_reference(servers, {"w": 1}, "float32")
  assert servers.sent == {"w": 1}
  with pytest.raises(ConfigError, match=r"a server computes in 'bfloat16'"):
    reference.send_reference(ReferenceServers(("float32", "bfloat16")), {}, "float32")


def test_batches_carry_the_servers_reference_and_the_seam_is_the_inner_modes():
  inner = FakeRollout(FakeSampler(lambda prompt, sampling, i: [3, 4, 5]))
  rollout = reference.SamplerReferenceRollout(inner, ReferenceServers())
  out = rollout.collect()
  np.testing.assert_array_equal(out.batch.ref_logprobs, [[-1.0, -2.0, -3.0, 0.0]])
  assert out.metrics["time_reference"] >= 0 and out.metrics["version"] == 0.0
  rollout.set_step(3)
  assert rollout.state() == {"position": 1} and rollout.pop_mix() == {"arith": 1}
  rollout.restore({"position": 0})
  rollout.settle()
  rollout.close()
  assert inner.calls == ["set_step", "state", "pop_mix", "restore", "settle", "close"]
  assert inner.step == 3 and inner.position == 0 and inner.closed
  broken = reference.SamplerReferenceRollout(inner, ReferenceServers(wrong_shape=True))
  with pytest.raises(RuntimeError, match=r"reference log-probs of shape \[1, 3\] for rows "
                                         r"\[1, 4\]"):
    broken.collect()
