"""Who may talk to a sampling server: the token (none, wrong, right), TLS and mutual TLS
with a CA made here, the JetStream service under the same rule, loopback only without a
credential, short errors to strangers, versions that never go back."""

import datetime
import ipaddress
import time
import types

import grpc
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.sampling.remote.client import SamplerClient
from rlhf_jax.sampling.remote.fleet import SamplerFleet
from rlhf_jax.sampling.scheduler.scheduler import Scheduler
from rlhf_jax.sampling.serve import security as security_lib
from rlhf_jax.sampling.serve import server as server_lib
from rlhf_jax.sampling.serve import wire
from rlhf_jax.sampling.serve.protos import jetstream_pb2
from rlhf_jax.sampling.serve.protos import jetstream_pb2_grpc
from rlhf_jax.sampling.serve.security import ClientSecurity
from rlhf_jax.sampling.serve.security import ServerSecurity
from tests.sampling.serve_configs import serve_config
from tests.sampling.server_engine import CONFIG
from tests.sampling.server_engine import ENGINE
from tests.sampling.server_engine import PARAMS

TOKEN = b"s3cret-token-for-tests"
PROMPT = [5, 9, 11]
SHORT = sampling.SamplingParams(max_new_tokens=3, seed=0)


def serve(security=None, **kwargs):
  scheduler = Scheduler(ENGINE, PARAMS, prompt_buckets=(8,), steps_per_sync=2)
  return server_lib.start_server(scheduler, port=0, max_workers=4, security=security,
                                 **kwargs)


@pytest.fixture()
def token_server(request):
  auth = getattr(request, "param", "writes")
  server, port, service = serve(ServerSecurity(token=TOKEN, auth=auth))
  yield f"localhost:{port}", service
  server.stop(grace=None)
  service.stop()


def code_of(call):
  with pytest.raises(grpc.RpcError) as error:
    call()
  return error.value.code(), error.value.details()


def test_write_rpcs_need_the_token_reads_do_not(token_server):
  address, service = token_server
  _, new_params = models.init_model(CONFIG, seed=5)
  for token in (None, b"wrong-token", TOKEN[:-1]):
    with SamplerClient(address, timeout_s=30, security=ClientSecurity(token=token)) as client:
      assert client.generate_one(PROMPT, SHORT)[0].token_ids  # a read: open
      assert code_of(lambda: client.update_weights(new_params, version=1))[0] == (
          grpc.StatusCode.UNAUTHENTICATED)
      assert code_of(lambda: client.update_reference(new_params))[0] == (
          grpc.StatusCode.UNAUTHENTICATED)
      assert code_of(lambda: client.cancel("any", sample_index=0))[0] == (
          grpc.StatusCode.UNAUTHENTICATED)
  assert service.metrics()["rpcs_unauthenticated"] == 9
  assert service.scheduler.newest_version() == 0
  with SamplerClient(address, timeout_s=30, security=ClientSecurity(token=TOKEN)) as client:
    assert client.update_weights(new_params, version=1).version == 1
    client.cancel("any", sample_index=0)
  assert service.scheduler.newest_version() == 1


@pytest.mark.parametrize("token_server", ["all"], indirect=True)
def test_auth_all_guards_every_rpc_and_the_jetstream_service(token_server):
  address, service = token_server
  with SamplerClient(address, timeout_s=30) as anonymous:
    assert code_of(anonymous.health)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: anonymous.generate_one(PROMPT, SHORT))[0] == (
        grpc.StatusCode.UNAUTHENTICATED)
  request = jetstream_pb2.DecodeRequest(
      max_tokens=3, token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=PROMPT))
  with grpc.insecure_channel(address) as channel:
    stub = jetstream_pb2_grpc.OrchestratorStub(channel)
    assert code_of(lambda: stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30)
                   )[0] == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: list(stub.Decode(request, timeout=30)))[0] == (
        grpc.StatusCode.UNAUTHENTICATED)
    bearer = [("authorization", "Bearer " + TOKEN.decode())]
    assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=30,
                            metadata=bearer).is_live
    assert len(list(stub.Decode(request, timeout=30, metadata=bearer))) >= 2
  with SamplerClient(address, timeout_s=30, security=ClientSecurity(token=TOKEN)) as client:
    assert client.health().is_live and client.generate_one(PROMPT, SHORT)
  assert service.metrics()["rpcs_unauthenticated"] == 4


def test_an_authenticated_caller_hears_which_tensor_is_wrong(token_server):
  address, _ = token_server
  bad = dict(PARAMS)
  bad["embed"] = np.zeros((3, 3), np.float32)
  with SamplerClient(address, timeout_s=30, security=ClientSecurity(token=TOKEN)) as client:
    code, details = code_of(lambda: client.update_weights(bad, version=1))
  assert code == grpc.StatusCode.INVALID_ARGUMENT and "embed" in details


def test_versions_never_go_back_unless_a_rollback_is_asked_for(token_server):
  address, service = token_server
  with SamplerClient(address, timeout_s=30, security=ClientSecurity(token=TOKEN)) as client:
    assert code_of(lambda: client.update_weights(PARAMS, version=-12345))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT)
    client.update_weights(PARAMS, version=4)
    client.update_weights(PARAMS, version=4)  # the same again (a fleet re-sends): taken
    code, details = code_of(lambda: client.update_weights(PARAMS, version=3))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "older" in details
    assert service.scheduler.newest_version() == 4
    client.rollback_params(PARAMS, version=3)  # a job pinned to an older version
    assert service.scheduler.newest_version() == 3
    assert code_of(lambda: client.rollback_params(PARAMS, version=-1))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT)


def test_no_credential_means_loopback_only(tmp_path):
  with pytest.raises(ValueError, match="not loopback"):
    server_lib.listen("0.0.0.0", 0)
  for host in ("localhost", "127.0.0.1", "[::1]"):
    assert security_lib.is_loopback(host)
  assert not security_lib.is_loopback("0.0.0.0") and not security_lib.is_loopback("10.0.0.1")
  config = serve_config()
  config.server.host = "0.0.0.0"
  with pytest.raises(ConfigError, match=r"config\.server\.host"):
    security_lib.server_security(config.server)
  token = tmp_path / "token"
  token.write_text("  abc123\n")
  config.server.token_file = str(token)
  assert security_lib.server_security(config.server).token == b"abc123"
  for field, value in (("token_file", str(tmp_path / "missing")), ("auth", "some"),
                       ("tls_cert", str(token))):
    broken = serve_config()
    broken.server[field] = value
    with pytest.raises(ConfigError, match=rf"config\.server\.{field}"):
      security_lib.server_security(broken.server)


def make_pki(directory):
  """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate."""
  x509 = pytest.importorskip("cryptography.x509")
  from cryptography.hazmat.primitives import hashes
  from cryptography.hazmat.primitives import serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID
  now = datetime.datetime.now(datetime.timezone.utc)

  def certificate(name, key, issuer, issuer_key, ca=False, sans=()):
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
      builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())

  def pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())

  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test ca")])
  ca = certificate("test ca", ca_key, ca_name, ca_key, ca=True)
  out = {"ca": ca.public_bytes(serialization.Encoding.PEM)}
  for who, sans in (("server", (x509.DNSName("localhost"),
                                x509.IPAddress(ipaddress.ip_address("127.0.0.1")))),
                    ("client", ())):
    key = ec.generate_private_key(ec.SECP256R1())
    out[who] = certificate(who, key, ca_name, ca_key, sans=sans).public_bytes(
        serialization.Encoding.PEM)
    out[who + "_key"] = pem(key)
  for name, data in out.items():
    (directory / f"{name}.pem").write_bytes(data)
  return out


def test_tls_and_mutual_tls_with_a_test_ca(tmp_path):
  pki = make_pki(tmp_path)
  security = ServerSecurity(token=TOKEN, tls_cert=pki["server"], tls_key=pki["server_key"],
                            tls_ca=pki["ca"])
  server, port, service = serve(security)
  address = f"localhost:{port}"
  try:
    trusted = ClientSecurity(token=TOKEN, tls_ca=pki["ca"], tls_cert=pki["client"],
                             tls_key=pki["client_key"])
    with SamplerClient(address, timeout_s=30, security=trusted) as client:
      assert client.generate_one(PROMPT, SHORT)[0].token_ids
      assert client.update_weights(PARAMS, version=2).version == 2
    for stranger in (ClientSecurity(token=TOKEN),  # plain TCP to a TLS port
                     ClientSecurity(token=TOKEN, tls_ca=pki["ca"])):  # no client cert
      with SamplerClient(address, timeout_s=5, security=stranger) as client:
        assert code_of(client.health)[0] == grpc.StatusCode.UNAVAILABLE
  finally:
    server.stop(grace=None)
    service.stop()
  # The config reads the same files.
  config = serve_config()
  config.server.host = "0.0.0.0"
  config.server.tls_cert, config.server.tls_key, config.server.tls_ca = (
      str(tmp_path / "server.pem"), str(tmp_path / "server_key.pem"), str(tmp_path / "ca.pem"))
  assert security_lib.server_security(config.server).tls_ca == pki["ca"]  # mTLS: enough


def test_the_takeover_is_refused_at_its_first_write(token_server, monkeypatch):
  """The attack: an anonymous client asks for a weight update and reads the errors to
  guide it. Its very first write is refused by the gate, before any tensor is read."""
  address, service = token_server
  read = []
  monkeypatch.setattr(wire, "params_from_chunks", lambda *args: read.append(args))
  with SamplerClient(address, timeout_s=30) as client:
    code, details = code_of(lambda: client.update_weights(PARAMS, version=10**6))
  assert code == grpc.StatusCode.UNAUTHENTICATED and "embed" not in details
  assert read == [] and service.metrics()["rpcs_unauthenticated"] == 1
  assert service.scheduler.newest_version() == 0


def test_a_trainer_with_a_wrong_token_gets_one_line(token_server, tmp_path):
  from rlhf_jax.sampling.remote import connect as remote
  from rlhf_jax.sampling.config import sampler_config
  address, service = token_server
  section = sampler_config()
  section.address = address
  token = tmp_path / "token"
  token.write_text("not-the-token\n")
  section.token_file = str(token)
  client = remote.connect(section)
  with pytest.raises(ConfigError, match=r"^config\.sampler\.token_file: the sampling "
                     "server refused it"):
    remote.push_initial(client, PARAMS)
  token.write_text(TOKEN.decode())
  remote.push_initial(remote.connect(section), PARAMS)
  section.address, section.addresses = "", (address,)
  section.token_file = ""
  with pytest.raises(ConfigError, match=r"config\.sampler\.token_file"):
    remote.push_initial(remote.connect(section), PARAMS)


def test_a_job_pinned_to_an_older_version_rolls_the_server_back(token_server):
  from rlhf_jax.sampling.versioned import VersionedSampler
  address, service = token_server
  client = SamplerClient(address, timeout_s=30, security=ClientSecurity(token=TOKEN))
  versioned = VersionedSampler(client, PARAMS, keep=3)
  _, newer = models.init_model(CONFIG, seed=9)
  versioned.update_params(newer, version=1)
  versioned.update_params(newer, version=2)
  with versioned.pinned(2):
    versioned.generate([PROMPT], SHORT)
  with versioned.pinned(1):  # evaluation ran ahead; the next job samples version 1
    (samples,) = versioned.generate([PROMPT], SHORT)
  assert samples[0].weights_version == (1, 1)
  client.close()


def served(service, version):
  """Hands the server weights `version` (None: none), then waits until its loop serves
  the newest it was given; returns that version."""
  if version is not None:
    service.update_params(PARAMS, version)
  deadline = time.monotonic() + 30
  while service.scheduler.has_work() and time.monotonic() < deadline:
    time.sleep(0.01)
  return service.scheduler.weights_version


def resuming_trainer(sampler, lines):
  """A Trainer with just what `_resume` touches: nothing restored but the step."""
  from rlhf_jax.training import loop
  nothing = types.SimpleNamespace(restore=lambda state: None, policy_params=PARAMS,
                                  truncate_after=lambda step, log: None)
  trainer = object.__new__(loop.Trainer)
  trainer.__dict__.update(sampler=sampler, learner=nothing, rollout=nothing, metrics=nothing,
                          rollout_log=nothing, log=lines.append, policy=None, mesh=None,
                          config=types.SimpleNamespace(to_dict=dict),
                          to_sampler=lambda params: params)  # a server takes host arrays
  return trainer


def test_a_new_or_resumed_trainer_owns_a_running_servers_weights_version(token_server):
  """A run stopped after its last checkpoint (step 3) leaves its server holding version 5.
  The next trainer's first weights (version 0) and its resume's (step 3) are taken,
  through one client and a fleet alike; a wrong token is still one line."""
  from rlhf_jax.sampling.remote import connect as remote
  address, service = token_server
  security = ClientSecurity(token=TOKEN)
  lines = []
  for sampler in (SamplerClient(address, timeout_s=30, security=security),
                  SamplerFleet([address], timeout_s=30, security=security, log=lines.append)):
    sampler.wait_ready()
    served(service, 5)
    remote.push_initial(sampler, PARAMS)
    assert served(service, None) == 0
    served(service, 5)
    trainer = resuming_trainer(sampler, lines)
    trainer._resume(3, None, {"step": 3, "rollout": {}, "config": {}})  # pylint: disable=protected-access
    assert trainer.step == 3 and served(service, None) == 3
    sampler.close()
  assert lines[-1] == "resumed from step 3"
  wrong = SamplerClient(address, timeout_s=30, security=ClientSecurity(token=b"wrong"))
  with pytest.raises(ConfigError, match=r"^config\.sampler\.token_file: the sampling server "
                     "refused it"):
    remote.push_initial(wrong, PARAMS)
