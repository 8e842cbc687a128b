"""Every implementation in rlhf_jax/ satisfies its protocol, and so does each shared fake
(tests/fakes.py).

Implementations are found, not listed: every class defined in the library's modules
that has a sampler's `generate` and `update_params`, a scorer's `score` in rewards/ (or
derives from ScorerBase anywhere), a rollout's `collect` (or derives from StreamRollout), or an
environment's `reset` and `step`. Each is checked structurally against the Protocol (the
methods exist and take the Protocol's arguments by the same names), since most need a
model, a server or worker processes to build; the cheap ones, and the fakes, are also
checked with isinstance. The samplers' optional extras are a declared table: a sampler
that gains or loses one must say so here.
"""

import importlib
import inspect
import pkgutil
import typing

import jax.numpy as jnp
import pytest

import rlhf_jax
from rlhf_jax import models
from rlhf_jax.envs.base import Environment
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import ScorerBase
from rlhf_jax.rollout.base import Rollout
from rlhf_jax.rollout.base import StreamRollout
from rlhf_jax.sampling import protocol
from rlhf_jax.sampling.versioned import VersionedSampler
from tests import fakes

grpc = pytest.importorskip("grpc")  # the server-side samplers' modules import it

EXTRAS = (protocol.PreparesParams, protocol.LoadsPrepared, protocol.RollsBack,
          protocol.KeepsVersions, protocol.ReportsMetrics, protocol.ReferenceSampler,
          protocol.Wrapper)
SERVER_EXTRAS = {protocol.PreparesParams, protocol.RollsBack, protocol.ReportsMetrics,
                 protocol.ReferenceSampler}
# The samplers of the library and the extras each declares.
SAMPLER_EXTRAS = {
    "rlhf_jax.sampling.scheduler.scheduler.Scheduler": {protocol.ReportsMetrics},
    "rlhf_jax.sampling.remote.client.SamplerClient": SERVER_EXTRAS,
    "rlhf_jax.sampling.remote.fleet.SamplerFleet": SERVER_EXTRAS,
    "rlhf_jax.sampling.versioned.VersionedSampler": {protocol.KeepsVersions,
                                                     protocol.Wrapper},
    "rlhf_jax.sampling.process_shards.ProcessShardedSampler": {
        protocol.PreparesParams, protocol.LoadsPrepared, protocol.Wrapper},
}
# Bases that hold part of a protocol for their subclasses, not an implementation.
MIXINS = {StreamRollout, ScorerBase}


def library_classes() -> list[type]:
  """Every class defined in a module of rlhf_jax (each module imported)."""
  classes = {}
  for info in pkgutil.walk_packages(rlhf_jax.__path__, "rlhf_jax."):
    if ".protos" in info.name:
      continue
    module = importlib.import_module(info.name)
    for value in vars(module).values():
      if (inspect.isclass(value) and value.__module__ == info.name
          and not getattr(value, "_is_protocol", False)):
        classes[f"{value.__module__}.{value.__qualname__}"] = value
  return [classes[name] for name in sorted(classes)]


def has(cls: type, *names: str) -> bool:
  return all(callable(inspect.getattr_static(cls, n, None)) for n in names)


def implementations(protocol_class) -> list[type]:
  """The library's classes that implement (or claim to implement) `protocol_class`."""
  found = {
      protocol.Sampler: lambda c: has(c, "generate", "update_params"),
      Scorer: lambda c: issubclass(c, ScorerBase) or (
          c.__module__.startswith("rlhf_jax.rewards.") and has(c, "score")),
      Rollout: lambda c: has(c, "collect") or issubclass(c, StreamRollout),
      Environment: lambda c: has(c, "reset", "step"),
  }[protocol_class]
  return [c for c in library_classes() if c not in MIXINS and found(c)]


def methods(protocol_class) -> dict[str, inspect.Signature]:
  """The Protocol's methods (its bases' included) and their signatures."""
  out = {}
  for base in reversed(protocol_class.__mro__):
    if base in (typing.Protocol, typing.Generic, object):
      continue
    for name, value in vars(base).items():
      if not name.startswith("_") and callable(value):
        out[name] = inspect.signature(value)
  return out


def mismatches(cls: type, protocol_class) -> list[str]:
  """What `cls` lacks of `protocol_class`: a method, or an argument it takes (by name;
  *args / **kwargs take anything), or a required argument the Protocol does not pass."""
  problems = []
  for name, wanted in methods(protocol_class).items():
    member = inspect.getattr_static(cls, name, None)
    if not callable(member):
      problems.append(f"{cls.__name__}.{name} is missing")
      continue
    have = inspect.signature(getattr(cls, name)).parameters
    kinds = {p.kind for p in have.values()}
    for arg in list(wanted.parameters)[1:]:  # past self
      if arg not in have and not kinds & {inspect.Parameter.VAR_POSITIONAL,
                                          inspect.Parameter.VAR_KEYWORD}:
        problems.append(f"{cls.__name__}.{name} takes no {arg!r}")
    for arg, p in list(have.items())[1:]:
      if (p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
          and arg not in wanted.parameters):
        problems.append(f"{cls.__name__}.{name} requires {arg!r}")
  return problems


@pytest.mark.parametrize("protocol_class, at_least", [
    (protocol.Sampler, 5), (Scorer, 8), (Rollout, 7), (Environment, 1)])
def test_every_implementation_in_the_library_satisfies_its_protocol(protocol_class,
                                                                     at_least):
  found = implementations(protocol_class)
  assert len(found) >= at_least, [c.__qualname__ for c in found]  # discovery works
  problems = [p for cls in found for p in mismatches(cls, protocol_class)]
  assert not problems, problems


def test_each_sampler_declares_exactly_its_extras():
  samplers = {f"{c.__module__}.{c.__qualname__}": c
              for c in implementations(protocol.Sampler)}
  assert set(samplers) == set(SAMPLER_EXTRAS)  # a new sampler: add it to the table
  for name, cls in samplers.items():
    declared = SAMPLER_EXTRAS[name]
    for extra in EXTRAS:
      data = set(typing.get_type_hints(extra)) - {"return"}
      if data:  # a data member (KeepsVersions.keep): on an instance, below
        continue
      assert (not mismatches(cls, extra)) == (extra in declared), (name, extra.__name__)


def test_cheap_instances_satisfy_their_protocols_by_isinstance():
  versioned = VersionedSampler(fakes.FakeSampler(), {"w": jnp.zeros(2)}, keep=3)
  assert isinstance(versioned, protocol.Sampler)
  assert isinstance(versioned, protocol.KeepsVersions) and versioned.keep == 3
  assert isinstance(versioned, protocol.Wrapper)
  # The wrapper forwards the Sampler interface only; extras are found behind it.
  assert not isinstance(versioned, protocol.ReportsMetrics)
  assert not isinstance(versioned, protocol.RollsBack)
  from rlhf_jax.rewards import RewardRouter  # pylint: disable=import-outside-toplevel
  router = RewardRouter({})
  assert isinstance(router, Scorer)
  router.close()


def test_the_shared_fakes_satisfy_their_protocols():
  sampler = fakes.FakeSampler()
  assert isinstance(sampler, protocol.Sampler)
  assert not any(isinstance(sampler, extra) for extra in EXTRAS)  # the bare seam
  assert isinstance(fakes.FakeScorer(), Scorer)
  assert isinstance(fakes.FakeRollout(), Rollout)
  assert isinstance(fakes.FakeEnvironment(), Environment)
  tokenizer = fakes.fake_tokenizer()
  assert isinstance(tokenizer, models.Tokenizer)  # the library's tokenizer class
  assert tokenizer.decode(tokenizer.encode("3 + 4 = 7")) == "3 + 4 = 7"
  for fake, protocol_class in [(fakes.FakeSampler, protocol.Sampler),
                               (fakes.FakeScorer, Scorer), (fakes.FakeRollout, Rollout),
                               (fakes.FakeEnvironment, Environment)]:
    assert not mismatches(fake, protocol_class), fake


def test_the_structural_check_catches_a_missing_method_and_a_renamed_argument():
  class NoClose(fakes.FakeScorer):
    close = None

  class Renamed(fakes.FakeSampler):
    def update_params(self, weights, version):  # pylint: disable=arguments-renamed
      pass

  assert mismatches(NoClose, Scorer) == ["NoClose.close is missing"]
  assert mismatches(Renamed, protocol.Sampler) == [
      "Renamed.update_params takes no 'params'", "Renamed.update_params requires 'weights'"]
