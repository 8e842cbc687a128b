"""rlhf_jax.sampling.serve: the sampler in its own process, behind gRPC.

- `server`: the wiring (one port, the worker threads, the model a config names);
- `loop`: `SamplerService`, the thread that runs the scheduler and its request queues;
- `handlers`: the Sampler and JetStream Orchestrator services over it;
- `wire`: sampling parameters, samples and weights ⇄ protos (shared with the client);
- `security` (the token and TLS settings, as data) and `auth` (the gate over gRPC);
- `config`: the server config's validation (configs/serve.py) and the model it names;
- `reference`: the trainer's frozen reference weights on a server;
- `protos`: the services' .proto files and their generated modules.

`server`, `handlers`, `wire`, `auth` and `protos` need the `serve` extra (grpcio,
protobuf); `loop`, `security`, `config` and `reference` do not, and nothing is imported
here, so the config checks run without it.
"""
