"""The seam between NNX modules and the pure training core.

`init_model` builds a `DecoderLM`, splits it once into a `FunctionalModel`
(graph definition + abstract state) and a plain nested dict of parameter
arrays. Everything downstream — optax, orbax, sharding, jit — sees only that
dict; `FunctionalModel.apply(params, ...)` merges it back for the call. No
training code depends on NNX internals.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from rlhf_jax.models.decoder import DecoderLM
from rlhf_jax.models.decoder import HeadKind
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.hf.metadata import CheckpointSource

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionalModel:
  """A DecoderLM as a pure function of its parameter dict.

  Attributes:
    config: the DecoderConfig.
    head: "lm" or "scalar".
    graphdef: NNX graph definition.
    abstract_state: nnx.State of ShapeDtypeStructs (the parameter template).
    source: the HF checkpoint it was loaded from (`hf.metadata.CheckpointSource`: the
      config.json keys, generation config and dtype an export writes back), or None.
  """
  config: DecoderConfig
  head: str
  graphdef: Any
  abstract_state: Any
  source: CheckpointSource | None = None

  def apply(self, params: Params, tokens: jax.Array, *, method=None, **kwargs):
    """`DecoderLM.__call__` with the given parameters (see its docstring), or
    `method(module, tokens, **kwargs)` on the merged module when `method` is given
    (e.g. `rlhf_jax.models.lm_head.token_logprobs`)."""
    state = jax.tree.map(lambda leaf: leaf, self.abstract_state)  # fresh Variables
    nnx.replace_by_pure_dict(state, compute_params(params, self.config))
    module = nnx.merge(self.graphdef, state)
    return module(tokens, **kwargs) if method is None else method(module, tokens, **kwargs)

  def abstract_params(self) -> Params:
    """The parameter dict as ShapeDtypeStructs (for loading and sharding)."""
    return nnx.to_pure_dict(self.abstract_state)

  def logical_axes(self) -> Params:
    """The parameter dict's logical axis names, one tuple per array."""
    return logical_axes(self.abstract_state)


# The parameters a forward reads only in the compute dtype (GEMM operands and the q/k/v
# biases). The embedding is not among them (rows are gathered, then cast), nor the norms
# (Gemma's (1 + w) is formed in float32) and the scalar head (float32).
COMPUTE_CAST = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "q_bias", "k_bias",
                          "v_bias", "gate_proj", "up_proj", "down_proj", "lm_head"})


def compute_params(params: Params, config: DecoderConfig) -> Params:
  """`params` with the COMPUTE_CAST leaves in the compute dtype: one cast per forward at
  its top instead of one per use inside the layers (a rematerialised layer recast its
  float32 kernels in the backward; a stacked one sliced float32 kernels then cast each
  slice). The cast's transpose returns the gradients in the parameters' dtype."""
  dtype = config.jnp_dtype

  def cast(path, leaf):
    name = getattr(path[-1], "key", None)
    return leaf.astype(dtype) if name in COMPUTE_CAST and leaf.dtype != dtype else leaf
  return jax.tree_util.tree_map_with_path(cast, params)


def critic_from_policy(policy: FunctionalModel, policy_params: Params
                       ) -> tuple[FunctionalModel, Params]:
  """A critic (scalar head) whose backbone starts as a copy of the policy's.

  The LM head is dropped and the value head starts at zero, so V ≡ 0 before
  training (VC-PPO's value pretraining then fits it; arXiv:2503.01491 §4).

  Args:
    policy: the policy FunctionalModel (head "lm").
    policy_params: its parameters.
  Returns:
    (critic, critic_params); the backbone arrays are shared, not copied.
  """
  critic, abstract = init_model(policy.config, head="scalar", abstract=True)
  critic = dataclasses.replace(critic, source=policy.source)
  params = {key: value for key, value in policy_params.items() if key != "lm_head"}
  params["scalar_head"] = jnp.zeros(abstract["scalar_head"].shape,
                                          abstract["scalar_head"].dtype)
  params["scalar_bias"] = jnp.zeros((), abstract["scalar_bias"].dtype)
  return critic, params


def score_at_last_token(values: jax.Array, mask: jax.Array) -> jax.Array:
  """A reward model's sequence score: its scalar output at each row's last valid token.

  Args:
    values: [B, T] scalar-head outputs.
    mask: [B, T] 0/1 (prompt + response tokens that were fed).
  Returns:
    [B] scores (0 for an empty row).
  """
  from rlhf_jax.kernels import last_valid_index  # kernels import nothing of ours

  last = last_valid_index(mask)
  picked = jnp.take_along_axis(values, jnp.maximum(last, 0)[:, None], axis=1)[:, 0]
  return jnp.where(last >= 0, picked, 0.0)


def logical_axes(state) -> Params:
  """Pure dict of each parameter's `logical_axes` metadata."""
  axes = jax.tree.map(lambda variable: variable.get_metadata().get("logical_axes"), state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))
  return nnx.to_pure_dict(axes) if isinstance(axes, nnx.State) else axes


def init_model(config: DecoderConfig, *, seed: int = 0, head: HeadKind = "lm",
               abstract: bool = False) -> tuple[FunctionalModel, Params]:
  """Builds a DecoderLM and returns it split as (FunctionalModel, params).

  Args:
    config: the model config.
    seed: initialisation seed.
    head: "lm" (policy / reference) or "scalar" (critic / reward model).
    abstract: return ShapeDtypeStructs instead of arrays (nothing allocated),
      e.g. to load a checkpoint straight into a sharded layout.
  Returns:
    (model, params): params is a nested dict of arrays.
  """
  build = lambda: DecoderLM(config, rngs=nnx.Rngs(seed), head=head)
  abstract_model = nnx.eval_shape(build)
  graphdef, abstract_state = nnx.split(abstract_model, nnx.Param)
  model = FunctionalModel(config=config, head=head, graphdef=graphdef,
                          abstract_state=abstract_state)
  if abstract:
    return model, nnx.to_pure_dict(abstract_state)
  # One program for every parameter (eagerly, each shape compiled its own draw and scale).
  initial = jax.jit(lambda: nnx.to_pure_dict(nnx.split(build(), nnx.Param)[1]))
  return model, initial()


def with_numerics(model: FunctionalModel, **runtime) -> FunctionalModel:
  """The same model (same parameter tree) with other runtime numerics: `DecoderConfig`
  fields that are not part of a checkpoint (dtype, matmul_precision, logprob_chunk,
  remat, remat_policy, attention_impl, decode_attention, expert_kernel), e.g. a bf16
  sampler's copy of a float32 trainer's policy; the source checkpoint is kept."""
  unknown = set(runtime) - RUNTIME_FIELDS
  if unknown:
    raise ValueError(f"with_numerics: {', '.join(sorted(unknown))} not runtime fields; "
                     f"allowed: {', '.join(sorted(RUNTIME_FIELDS))}.")
  config = model.config.replace(**runtime)
  if config == model.config:
    return model
  return dataclasses.replace(init_model(config, head=model.head, abstract=True)[0],
                             source=model.source)


# DecoderConfig fields that change how a model computes, never its parameter tree.
RUNTIME_FIELDS = frozenset({"dtype", "matmul_precision", "logprob_chunk", "remat",
                            "remat_policy", "attention_impl", "decode_attention",
                            "expert_kernel"})
