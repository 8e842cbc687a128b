"""Who may talk to a sampling server, as data (no grpc here: the config checks use it).

A server holds a shared secret (`server.token_file`) and, optionally, a TLS key pair
(`server.tls_cert`, `server.tls_key`) and a CA whose client certificates it requires
(`server.tls_ca`: mutual TLS). Clients send the secret as gRPC metadata
`authorization: Bearer <token>` (`sampler.token_file`) and trust the server's certificate
through `sampler.tls_ca`. `serve/auth.py` turns these into interceptors and channel
credentials.

Without a credential (no token, no mutual TLS) a server only binds loopback: anyone who
reaches the port could otherwise replace the served weights.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os

from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of

AUTH_MODES = ("writes", "all")  # which RPCs need the token
# The RPCs that change what the server does for everyone.
WRITE_METHODS = ("/rlhf_jax.sampling.Sampler/UpdateWeights",
                 "/rlhf_jax.sampling.Sampler/UpdateReference",
                 "/rlhf_jax.sampling.Sampler/Cancel")
MAX_TOKEN_BYTES = 4096
# Sent with an UpdateWeights that goes back to an older version on purpose (a trainer's job
# pinned to it); without it a server refuses an older version.
ROLLBACK_HEADER = ("x-rlhf-jax-rollback", "1")


@dataclasses.dataclass(frozen=True)
class ServerSecurity:
  """A server's credentials (bytes read from the config's files).

  Attributes:
    token: the shared secret callers must send, or None (no token check).
    auth: "writes" (only WRITE_METHODS need the token) or "all" (every RPC).
    tls_cert, tls_key: PEM key pair to serve TLS with, or None (plain TCP).
    tls_ca: PEM CA bundle; when set, clients must present a certificate it signed.
  """
  token: bytes | None = None
  auth: str = "writes"
  tls_cert: bytes | None = None
  tls_key: bytes | None = None
  tls_ca: bytes | None = None

  @property
  def has_credential(self) -> bool:
    """A token or client certificates: enough to listen beyond loopback."""
    return self.token is not None or self.tls_ca is not None


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
  """What a client presents (bytes): the token, the CA that signed the server's
  certificate (TLS when set), and its own key pair for mutual TLS."""
  token: bytes | None = None
  tls_ca: bytes | None = None
  tls_cert: bytes | None = None
  tls_key: bytes | None = None


def is_loopback(host: str) -> bool:
  """Whether `host` names only this machine ("localhost", 127.0.0.0/8, ::1)."""
  host = host.strip("[]")
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def read_file(field: str, path: str, *, limit: int = 1 << 20) -> bytes:
  """The bytes of the file a config field names; ConfigError naming the field if it is
  missing, unreadable, empty or larger than `limit`."""
  try:
    with open(os.path.expanduser(path), "rb") as handle:
      data = handle.read(limit + 1)
  except OSError as error:
    invalid(field, path, f"must be a readable file ({error.strerror})")
  if not data.strip():
    invalid(field, path, "is empty")
  if len(data) > limit:
    invalid(field, path, f"is larger than {limit} bytes")
  return data


def read_token(field: str, path: str) -> bytes:
  """The shared secret in `path` (surrounding whitespace dropped)."""
  token = read_file(field, path, limit=MAX_TOKEN_BYTES).strip()
  if any(b < 0x21 or b > 0x7e for b in token):
    invalid(field, path, "must hold one line of printable ASCII (it travels as a header)")
  return token


def _optional(field: str, path: str) -> bytes | None:
  return read_file(field, path) if path else None


def server_security(server, prefix: str = "server") -> ServerSecurity:
  """The ServerSecurity of a config's `server` section (token_file, auth, tls_*), its
  files read and checked; ConfigError naming the field otherwise."""
  one_of(f"{prefix}.auth", server.auth, AUTH_MODES)
  if bool(server.tls_cert) != bool(server.tls_key):
    invalid(f"{prefix}.tls_cert", server.tls_cert, f"and {prefix}.tls_key go together")
  if server.tls_ca and not server.tls_cert:
    invalid(f"{prefix}.tls_ca", server.tls_ca, f"needs {prefix}.tls_cert and "
            f"{prefix}.tls_key (mutual TLS)")
  security = ServerSecurity(
      token=read_token(f"{prefix}.token_file", server.token_file) if server.token_file
      else None, auth=server.auth,
      tls_cert=_optional(f"{prefix}.tls_cert", server.tls_cert),
      tls_key=_optional(f"{prefix}.tls_key", server.tls_key),
      tls_ca=_optional(f"{prefix}.tls_ca", server.tls_ca))
  if server.auth == "all" and security.token is None:
    invalid(f"{prefix}.auth", server.auth, f"needs {prefix}.token_file")
  if not is_loopback(server.host) and not security.has_credential:
    invalid(f"{prefix}.host", server.host, f"is not loopback: set {prefix}.token_file (or "
            f"{prefix}.tls_ca for client certificates) so that strangers cannot replace "
            "the served weights")
  return security


def client_security(sampler, prefix: str = "sampler") -> ClientSecurity:
  """The ClientSecurity of a config's `sampler` section (token_file, tls_ca, tls_cert,
  tls_key); ConfigError naming the field of a missing or empty file."""
  if bool(sampler.tls_cert) != bool(sampler.tls_key):
    invalid(f"{prefix}.tls_cert", sampler.tls_cert, f"and {prefix}.tls_key go together")
  if sampler.tls_cert and not sampler.tls_ca:
    invalid(f"{prefix}.tls_cert", sampler.tls_cert, f"needs {prefix}.tls_ca (TLS)")
  return ClientSecurity(
      token=read_token(f"{prefix}.token_file", sampler.token_file) if sampler.token_file
      else None,
      tls_ca=_optional(f"{prefix}.tls_ca", sampler.tls_ca),
      tls_cert=_optional(f"{prefix}.tls_cert", sampler.tls_cert),
      tls_key=_optional(f"{prefix}.tls_key", sampler.tls_key))
