"""Connecting a config's `sampler` section to its server(s): a client or a fleet with the
section's credentials, ready, holding the first weights; refusals in one line.

The trainer (`training/build.py`) calls `connect` then `push_initial`, which resets a
server's weights version to 0 (a rollback: the trainer owns the version; a resumed run
then sends its checkpoint's step). A server that refuses the token, or the weights, is a
ConfigError naming the field, not a traceback.
"""

from __future__ import annotations

from typing import Any

import grpc

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.remote.fleet import SamplerFleet
from rlhf_jax.sampling.serve.security import client_security


def connect(section, prefix: str = "sampler") -> SamplerClient | SamplerFleet:
  """A SamplerClient of `section.address`, or a SamplerFleet of `section.addresses`
  (`reconnect_s`), with the section's token and TLS files, once a server answers."""
  security = client_security(section, prefix)
  try:
    if tuple(section.addresses):
      sampler = SamplerFleet(tuple(section.addresses), reconnect_s=section.reconnect_s,
                             security=security)
    else:
      sampler = SamplerClient(section.address, security=security)
    sampler.wait_ready()
  except grpc.RpcError as error:
    raise _refused(error, prefix) from None
  return sampler


def push_initial(sampler, params: Any, prefix: str = "sampler") -> None:
  """Sends the first weights (version 0) as a rollback: the trainer owns the server's
  version, and a server still running from before (a stopped run now resumed) holds a
  newer one. ConfigError when a server refuses them (the token)."""
  try:
    sampler.rollback_params(params, version=0)
  except grpc.RpcError as error:
    raise _refused(error, prefix) from None


def _refused(error: grpc.RpcError, prefix: str) -> Exception:
  code, details = error.code(), error.details()
  if code == grpc.StatusCode.UNAUTHENTICATED:
    return ConfigError(f"config.{prefix}.token_file: the sampling server refused it "
                       f"({details})", field=f"{prefix}.token_file")
  if code == grpc.StatusCode.FAILED_PRECONDITION:
    return ConfigError(f"config.{prefix}.address: the sampling server refused the "
                       f"weights: {details}", field=f"{prefix}.address")
  return error
