"""rlhf_jax.sampling.serve: the sampler in its own process, behind gRPC (and HTTP).

- `server`: the wiring (one port, the worker threads, the model a config names);
- `loop`: `SamplerService`, the thread that runs the scheduler and its request queues;
- `handlers`: the Sampler and JetStream Orchestrator services over it;
- `wire`: sampling parameters, samples and weights ⇄ protos (shared with the client);
- `security` (the token and TLS settings, as data) and `auth` (the gate over gRPC);
- `config`: the server config's validation (configs/serve.py) and the model it names;
- `reference`: the trainer's frozen reference weights on a server;
- `protos`: the services' .proto files and their generated modules;
- `openai_http`: the OpenAI-compatible HTTP face beside gRPC (server.http_port), with
  `openai_prompts` (a request's prompt ids), `openai_wire` (fields ⇄ SamplingParams, the
  response bodies) and `openai_tools` (tool calls in and out of the chat template).

`server`, `handlers`, `wire`, `auth` and `protos` need the `serve` extra (grpcio,
protobuf), `openai_http` and `openai_prompts` its aiohttp; `loop`, `security`, `config`,
`reference`, `openai_wire` and `openai_tools` do not, and nothing is imported here, so the
config checks run without it.
"""
