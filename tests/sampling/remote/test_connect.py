"""connect / push_initial: the first weights go as a rollback to version 0, and a server's
refusal is one ConfigError naming the field to fix (against a live server with a token:
tests/sampling/serve/test_security.py)."""

from __future__ import annotations

import grpc
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling.config import sampler_config
from rlhf_jax.sampling.remote import connect as connect_lib


class Refusal(grpc.RpcError):
  """A call that failed with `code`."""

  def __init__(self, code, details):
    super().__init__()
    self._code, self._details = code, details

  def code(self):
    return self._code

  def details(self):
    return self._details


class Sampler:
  """A client whose rollback fails with `error` (None: it takes the weights)."""

  def __init__(self, error=None):
    self.error = error
    self.rollbacks = []

  def rollback_params(self, params, version):
    self.rollbacks.append((params, version))
    if self.error is not None:
      raise self.error


def test_the_first_weights_are_a_rollback_to_version_zero():
  sampler = Sampler()
  connect_lib.push_initial(sampler, {"w": 1})
  assert sampler.rollbacks == [({"w": 1}, 0)]


@pytest.mark.parametrize("code, field", [
    (grpc.StatusCode.UNAUTHENTICATED, "token_file"),
    (grpc.StatusCode.FAILED_PRECONDITION, "address")])
def test_a_refusal_names_the_field_to_fix(code, field):
  sampler = Sampler(Refusal(code, "the details"))
  with pytest.raises(ConfigError) as error:
    connect_lib.push_initial(sampler, {}, prefix="judge.sampler")
  assert error.value.field == f"judge.sampler.{field}"
  message = str(error.value)
  assert message.startswith(f"config.judge.sampler.{field}: the sampling server refused")
  assert "the details" in message and "\n" not in message


def test_another_failure_is_raised_as_it_came():
  lost = Refusal(grpc.StatusCode.UNAVAILABLE, "gone")
  with pytest.raises(Refusal) as error:
    connect_lib.push_initial(Sampler(lost), {})
  assert error.value is lost


def test_a_section_whose_files_are_wrong_is_refused_before_any_call(tmp_path):
  section = sampler_config()
  section.address = "localhost:1"
  section.token_file = str(tmp_path / "missing")
  with pytest.raises(ConfigError, match=r"^config\.rollout\.sampler\.token_file: "):
    connect_lib.connect(section, prefix="rollout.sampler")
  (tmp_path / "empty").write_text("\n")
  section.token_file = str(tmp_path / "empty")
  with pytest.raises(ConfigError, match=r"^config\.sampler\.token_file: .*is empty"):
    connect_lib.connect(section)
