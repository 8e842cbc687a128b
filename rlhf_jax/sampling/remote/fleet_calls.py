"""The deadlines and failure kinds of a `SamplerFleet`'s calls to one server."""

from __future__ import annotations

import time

import grpc

# A call failing with one of these means the server (or the way to it) is gone.
SERVER_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
               grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)

HEALTH_TIMEOUT_S = 5.0  # a probe's Health deadline: a live server answers in far less
MIN_CALL_S = 0.5  # a call made at a deadline still gets this long


def before(deadline: float | None, cap: float | None) -> float | None:
  """A call's timeout in seconds: at most `cap` (None: the client's own) and the time
  left before `deadline` (time.monotonic(); None: no deadline), never under MIN_CALL_S,
  so a wait for a server is bounded by the caller's deadline, not the client's."""
  if deadline is None:
    return cap
  left = max(deadline - time.monotonic(), MIN_CALL_S)
  return left if cap is None else min(cap, left)


def describe(error: Exception) -> str:
  """An error in one line: a gRPC status's code and details, else its repr."""
  if isinstance(error, grpc.RpcError):
    return f"{error.code().name}: {error.details()}"
  return repr(error)
