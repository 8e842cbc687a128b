"""The Sampler seam: an extra found behind wrappers (outermost first) or refused in one
line, the Protocols asked with isinstance, and the records it passes (which samplers
satisfy the seam: tests/test_protocols.py)."""

from __future__ import annotations

import pytest

from rlhf_jax.sampling import protocol


class Bare:
  """A sampler with the seam's four methods and no extra."""

  def generate(self, prompts, sampling):
    return [[] for _ in prompts]

  def update_params(self, params, version):
    pass

  def cancel(self, request_id, sample_index=None):
    pass

  def close(self):
    pass


class Counting(Bare):
  """A sampler with figures of its own (the ReportsMetrics extra)."""

  def metrics(self):
    return {"queue": 0.0}


class Wrapping(Bare):
  """A sampler that samples through `inner` (the Wrapper extra)."""

  def __init__(self, inner):
    self.inner = inner

  def wrapped(self):
    return self.inner


class CountingWrapper(Wrapping, Counting):
  """A wrapper with figures of its own."""


def test_extras_are_asked_by_isinstance_on_the_methods_a_sampler_has():
  assert isinstance(Bare(), protocol.Sampler)
  assert not isinstance(Bare(), protocol.ReportsMetrics)
  assert isinstance(Counting(), protocol.ReportsMetrics)
  assert not isinstance(object(), protocol.Sampler)

  class NoClose:
    def generate(self, prompts, sampling): ...
    def update_params(self, params, version): ...
    def cancel(self, request_id, sample_index=None): ...

  assert not isinstance(NoClose(), protocol.Sampler)


def test_find_extra_looks_through_the_wrappers_outermost_first():
  counting = Counting()
  outer = Wrapping(Wrapping(counting))
  assert protocol.find_extra(outer, protocol.ReportsMetrics) is counting
  assert protocol.find_extra(outer, protocol.Wrapper) is outer
  nearer = CountingWrapper(Wrapping(counting))
  assert protocol.find_extra(nearer, protocol.ReportsMetrics) is nearer
  assert protocol.find_extra(Wrapping(Bare()), protocol.ReportsMetrics) is None
  assert protocol.find_extra(None, protocol.ReportsMetrics) is None
  assert protocol.find_extra(Wrapping(None), Counting) is None
  assert protocol.find_extra(Wrapping(counting), Counting) is counting  # a class too


def test_require_extra_says_who_needs_what():
  counting = Counting()
  assert protocol.require_extra(Wrapping(counting), protocol.ReportsMetrics, "x") is counting
  with pytest.raises(TypeError, match=r"^rollout\.reference_logprobs='sampler' needs a "
                     r"sampler that is a ReferenceSampler; Wrapping is not, nor wraps one$"):
    protocol.require_extra(Wrapping(Counting()), protocol.ReferenceSampler,
                           "rollout.reference_logprobs='sampler'")


def test_sampler_unavailable_is_the_runtime_error_the_loop_catches():
  assert issubclass(protocol.SamplerUnavailable, RuntimeError)
  with pytest.raises(RuntimeError, match="every server gone"):
    raise protocol.SamplerUnavailable("every server gone")


def test_completions_do_not_share_their_default_lists():
  fields = dict(request_id="r", sample_index=0, prompt_ids=[1], token_ids=[2],
                sampled_logprobs=[-0.1], model_logprobs=[-0.2], finish_reason="length",
                seed=3, weights_version=(0, 0))
  first, second = protocol.Completion(**fields), protocol.Completion(**fields)
  first.token_versions.append(0)
  first.candidate_logprobs.append(-1.0)
  assert second.token_versions == [] and second.candidate_logprobs == []
  assert first.error == "" and first.routes is None
