"""rlhf_jax.sampling.remote: the trainer's side of the sampling servers (needs the `serve`
extra: grpcio, protobuf).

- `client`: `SamplerClient`, one server behind the `Sampler` interface;
- `fleet`: `SamplerFleet`, several servers with routing and failover;
- `affinity`: which server keeps the KV cache a continuation can reuse;
- `connect`: a config's `sampler` section to its client or fleet, with the first weights.
"""
