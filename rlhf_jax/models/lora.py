"""LoRA: low-rank adapters on the decoder's projections (Hu et al. 2021, arXiv:2106.09685).

A targeted kernel W, viewed as the 2-D matrix [in, out] the decoder's `_dense`
multiplies by (q_proj [E, H, D] → [E, H·D], o_proj [H, D, E] → [H·D, E]), is
replaced by

    W_eff = W + (alpha / r) · A @ B,   A [in, r], B [r, out]

with A drawn like PEFT's `kaiming_uniform_(a=√5)` (U(±1/√in)) and B = 0, so the
model starts equal to the base. The scale alpha / r is the PEFT convention;
rsLoRA's alpha / √r (Kalajdzievski 2023, arXiv:2312.03732) is not implemented.
Adapters are float32 whatever the base's dtype.

The trained tree is `{"adapters": adapters, "base": base params}`. The base
rides inside the tree on purpose: `jax.jit` embeds closed-over arrays in the
program as constants (a 0.5B-parameter model would be baked into every
compilation), so it must reach jitted code as an argument, and the parameter
tree is the one argument a `TrainedRole` passes. `LoraModel.apply` stops the
gradient at the base, and `adapter_optimizer` gives the base zero updates and no
optimizer state, so only the adapters train and only they hold moments.

The adapter tree mirrors the parameter tree:
`adapters["layers"][i]["attention"]["q_proj"] = {"lora_a": A, "lora_b": B}`. A kernel with extra leading axes (a
stacked [L, ...] layer layout) gets adapters with the same leading axes
(A [L, in, r], B [L, r, out]). `LoraConfig.modules_to_save` names top-level
parameters trained in full (PEFT's `modules_to_save`; a critic's value head),
held in the adapter tree as float32 copies.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.functional import FunctionalModel
from rlhf_jax.models.functional import Params
from rlhf_jax.models.functional import init_model

# Projection → (module holding it, leading axes of W that form `in`, ndim of W).
PROJECTIONS = {
    "q_proj": ("attention", 1, 3), "k_proj": ("attention", 1, 3),
    "v_proj": ("attention", 1, 3), "o_proj": ("attention", 2, 3),
    "gate_proj": ("mlp", 1, 2), "up_proj": ("mlp", 1, 2), "down_proj": ("mlp", 1, 2),
}
ADAPTERS, BASE = "adapters", "base"
LORA_A, LORA_B = "lora_a", "lora_b"
RANK_AXIS = "lora_rank"  # the logical name of the rank axis; `rules_with_lora` maps it


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which kernels get adapters and how they are scaled.

  Attributes:
    rank: r, the inner width of A @ B.
    alpha: the scale numerator; W_eff = W + (alpha / r)·A@B (PEFT's `lora_alpha`).
    targets: projection names among q_proj, k_proj, v_proj, o_proj, gate_proj,
      up_proj, down_proj (default: all seven).
    modules_to_save: top-level parameter names trained in full, e.g.
      ("scalar_head", "scalar_bias") for a critic (PEFT's `modules_to_save`).
  """
  rank: int = 16
  alpha: float = 32.0
  targets: tuple[str, ...] = tuple(PROJECTIONS)
  modules_to_save: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))
    object.__setattr__(self, "modules_to_save", tuple(self.modules_to_save))
    if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
      raise ValueError(f"LoraConfig.rank={self.rank!r} must be a positive int.")
    if not self.alpha > 0:
      raise ValueError(f"LoraConfig.alpha={self.alpha!r} must be positive.")
    if not self.targets:
      raise ValueError("LoraConfig.targets is empty; name at least one projection.")
    for name in self.targets:
      if name not in PROJECTIONS:
        raise ValueError(f"LoraConfig.targets: {name!r} is not a projection; allowed: "
                         f"{', '.join(PROJECTIONS)}.")
    if len(set(self.targets)) != len(self.targets):
      raise ValueError(f"LoraConfig.targets={self.targets!r} repeats a name.")
    # One canonical order, so configs that name the same projections compare equal.
    object.__setattr__(self, "targets", tuple(n for n in PROJECTIONS if n in self.targets))

  @property
  def scale(self) -> float:
    """alpha / rank (PEFT's `scaling`)."""
    return self.alpha / self.rank


# ----------------------------------------------------------------------------- trees


def _key(entry) -> Any:
  return getattr(entry, "key", getattr(entry, "idx", entry))


def target_kernels(params: Params, lora: LoraConfig) -> list[tuple[tuple, Any]]:
  """(key path, kernel) of every kernel `lora` targets, in tree order.

  A kernel is `params[...][module][name]` with name in `lora.targets` and module
  its PROJECTIONS module ("attention" / "mlp"), at any depth, so a per-layer
  dict (`params["layers"][i]`) and a stacked layout (`params["layers"]` with a
  leading [L] axis) are both found.
  """
  found = []

  def visit(path, leaf):
    keys = tuple(_key(k) for k in path)
    if (len(keys) >= 2 and keys[-1] in lora.targets
        and keys[-2] == PROJECTIONS[keys[-1]][0]):
      found.append((keys, leaf))
  jax.tree_util.tree_map_with_path(visit, params)
  return found


def matrix_shape(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
  """(leading axes, in, out) of projection `name`'s kernel of `shape` seen as the
  [..., in, out] matrix the decoder multiplies by (q_proj [E, H, D] → in E,
  out H·D; o_proj [H, D, E] → in H·D, out E; any leading [L] axis kept)."""
  _, num_in, ndim = PROJECTIONS[name]
  if len(shape) < ndim:
    raise ValueError(f"{name} kernel of shape {shape} has fewer than {ndim} axes.")
  lead, core = tuple(shape[:len(shape) - ndim]), shape[len(shape) - ndim:]
  return lead, math.prod(core[:num_in]), math.prod(core[num_in:])


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def set_in(tree: dict, path: tuple, value) -> None:
  """`tree[path[0]][path[1]]... = value`, creating the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def adapter_entries(adapters: Params, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
  """(path, entry) pairs of an adapter tree: entry is {"lora_a", "lora_b"} for a
  low-rank adapter, an array for a module trained in full."""
  if isinstance(adapters, dict) and set(adapters) == {LORA_A, LORA_B}:
    yield path, adapters
  elif isinstance(adapters, dict):
    for key in adapters:
      yield from adapter_entries(adapters[key], path + (key,))
  else:
    yield path, adapters


def _expected_sizes(config: DecoderConfig) -> dict[str, tuple[int, int]]:
  e, h, k, d, f = (config.hidden_size, config.num_heads, config.num_kv_heads,
                   config.head_dim, config.intermediate_size)
  return {"q_proj": (e, h * d), "k_proj": (e, k * d), "v_proj": (e, k * d),
          "o_proj": (h * d, e), "gate_proj": (e, f), "up_proj": (e, f), "down_proj": (f, e)}


def init_adapters(config: DecoderConfig, params: Params, lora: LoraConfig,
                  seed: int = 0) -> Params:
  """Fresh float32 adapters for every kernel `lora` targets (merged model = base).

  Args:
    config: the model's DecoderConfig (kernel sizes are checked against it).
    params: the base parameters (arrays or ShapeDtypeStructs).
    lora: the LoraConfig.
    seed: seeds A; each kernel gets its own key.
  Returns:
    The adapter tree: A [..., in, r] ~ U(−1/√in, 1/√in) (PEFT's kaiming-uniform
    with a = √5 on its [r, in] lora_A), B [..., r, out] zeros; plus a float32
    copy of each `modules_to_save` parameter.
  Raises:
    ValueError naming the kernel or parameter when it is missing or its shape
    does not fit `config`.
  """
  if config.num_experts:
    raise ValueError(f"LoRA adapters of a mixture-of-experts model "
                     f"(architecture={config.architecture!r}) are not supported yet.")
  kernels = target_kernels(params, lora)
  if not kernels:
    raise ValueError(f"no kernel named {', '.join(lora.targets)} in the parameters.")
  expected = _expected_sizes(config)
  key = jax.random.key(seed)
  adapters: dict = {}
  for index, (path, kernel) in enumerate(kernels):
    lead, fan_in, fan_out = matrix_shape(path[-1], kernel.shape)
    if (fan_in, fan_out) != expected[path[-1]]:
      raise ValueError(f"kernel {'/'.join(map(str, path))} of shape {kernel.shape} is "
                       f"[{fan_in}, {fan_out}] as a matrix; the config says "
                       f"{list(expected[path[-1]])}.")
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(jax.random.fold_in(key, index), lead + (fan_in, lora.rank),
                           jnp.float32, -bound, bound)
    set_in(adapters, path, {LORA_A: a, LORA_B: jnp.zeros(lead + (lora.rank, fan_out),
                                                       jnp.float32)})
  for name in lora.modules_to_save:
    if name not in params:
      raise ValueError(f"LoraConfig.modules_to_save: {name!r} is not a parameter; the "
                       f"model has {', '.join(map(str, params))}.")
    # A copy, never the base's own array: a donated update must not see one buffer twice.
    adapters[name] = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), params[name])
  return adapters


def merged_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """kernel + scale·(a @ b), reshaped to kernel's shape and cast to its dtype.

  Args:
    kernel: W in its stored shape (e.g. [E, H, D], or [L, E, H, D]).
    a: [..., in, r]; b: [..., r, out] (leading axes as kernel's).
  Returns:
    W_eff, shape and dtype of `kernel`; the sum is formed in float32 with a
    float32-exact (HIGHEST) product.
  """
  delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
  merged = kernel.astype(jnp.float32) + scale * delta.reshape(kernel.shape)
  return merged.astype(kernel.dtype)


def merge(params: Params, adapters: Params, lora: LoraConfig) -> Params:
  """The full parameter tree with every adapter folded in (pure, jittable).

  Args:
    params: the base parameters.
    adapters: from `init_adapters` (or training / `hf.peft.load_peft_adapter`).
    lora: the LoraConfig (for the scale).
  Returns:
    params with each adapted kernel W → W + (alpha/r)·A@B (W's shape and dtype)
    and each `modules_to_save` parameter replaced (cast to the base's dtype);
    the other arrays are the base's own, not copies.
  """
  out = jax.tree.map(lambda x: x, params)  # fresh dicts, same leaves
  for path, entry in adapter_entries(adapters):
    base = _get(params, path)
    if isinstance(entry, dict):
      value = merged_kernel(base, entry[LORA_A], entry[LORA_B], lora.scale)
    else:
      value = jnp.asarray(entry).astype(base.dtype)
    set_in(out, path, value)
  return out


# ----------------------------------------------------------------------------- training


def adapter_optimizer(optimizer: optax.GradientTransformation
                      ) -> optax.GradientTransformation:
  """`optimizer` on the "adapters" half of a LoRA tree; zero updates and no state for
  the "base" half (so Adam moments exist for the adapters only).

  Global-norm clipping inside `optimizer` sees the adapter gradients only.
  """
  def labels(tree):
    return {part: jax.tree.map(lambda _: "train" if part == ADAPTERS else "frozen",
                               tree[part]) for part in tree}
  return optax.transforms.partition({"train": optimizer, "frozen": optax.set_to_zero()},
                                    labels)


def _axes_of(path, entry, base_axes) -> Any:
  """Logical axes of one adapter entry, named after its kernel's (so A@B comes out
  laid out like W): A (lead..., in, rank), B (lead..., rank, out)."""
  axes = tuple(_get(base_axes, path))
  if not isinstance(entry, dict):
    return axes
  _, num_in, ndim = PROJECTIONS[path[-1]]
  lead, core = axes[:len(axes) - ndim], axes[len(axes) - ndim:]
  return {LORA_A: lead + (core[0], RANK_AXIS), LORA_B: lead + (RANK_AXIS, core[num_in])}


def rules_with_lora(rules) -> dict:
  """A sharding rules table (`parallel.TRAIN_RULES`, ...) that also replicates the
  adapters' rank axis."""
  return {**rules, RANK_AXIS: None}


@dataclasses.dataclass(frozen=True, eq=False)
class LoraModel:
  """A FunctionalModel whose parameters are {"adapters": ..., "base": ...}.

  `apply(params, tokens, **kw)` runs the wrapped model on `merge(base, adapters)`
  with the gradient stopped at the base, so it stands in for a FunctionalModel in
  a `TrainedRole` (optimizer: `adapter_optimizer(...)`). The base is part of the
  argument tree, never closed over: jit would otherwise embed it as a constant.

  Attributes:
    model: the wrapped FunctionalModel.
    lora: the LoraConfig.
  """
  model: FunctionalModel
  lora: LoraConfig

  @property
  def config(self) -> DecoderConfig:
    """The wrapped model's DecoderConfig."""
    return self.model.config

  @property
  def head(self) -> str:
    """The wrapped model's head ("lm" or "scalar")."""
    return self.model.head

  def init_params(self, base: Params, seed: int = 0) -> Params:
    """{"adapters": fresh adapters (`init_adapters`), "base": base}."""
    return {ADAPTERS: init_adapters(self.config, base, self.lora, seed), BASE: base}

  def merged_params(self, params: Params) -> Params:
    """The wrapped model's parameters with the adapters folded in (what a sampler or
    an HF export needs)."""
    return merge(params[BASE], params[ADAPTERS], self.lora)

  def apply(self, params: Params, tokens: jax.Array, **kwargs):
    """`FunctionalModel.apply` on the merged weights; gradients reach the adapters only."""
    base = jax.lax.stop_gradient(params[BASE])
    return self.model.apply(merge(base, params[ADAPTERS], self.lora), tokens, **kwargs)

  def abstract_params(self) -> Params:
    """The LoRA tree as ShapeDtypeStructs."""
    base = self.model.abstract_params()
    adapters = jax.eval_shape(lambda p: init_adapters(self.config, p, self.lora), base)
    return {ADAPTERS: adapters, BASE: base}

  def logical_axes(self) -> Params:
    """Logical axis names of the LoRA tree; shard with `rules_with_lora(rules)`."""
    base_axes = self.model.logical_axes()
    adapters: dict = {}
    for path, entry in adapter_entries(self.abstract_params()[ADAPTERS]):
      set_in(adapters, path, _axes_of(path, entry, base_axes))
    return {ADAPTERS: adapters, BASE: base_axes}


# ----------------------------------------------------------------------------- sizes


def adapter_bytes(adapters: Params) -> int:
  """Bytes of an adapter tree (arrays or ShapeDtypeStructs)."""
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(adapters))


def lora_sizes(config: DecoderConfig, lora: LoraConfig, head: str = "lm") -> dict[str, int]:
  """Parameter counts from shapes alone (`jax.eval_shape`, nothing allocated).

  Returns:
    {"model": all parameters, "targets": parameters of the targeted kernels,
    "adapters": adapter parameters (A and B, plus `modules_to_save` copies)}.
  """
  _, abstract = init_model(config, head=head, abstract=True)
  adapters = jax.eval_shape(lambda p: init_adapters(config, p, lora), abstract)
  count = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  return {"model": count(abstract),
          "targets": sum(math.prod(k.shape) for _, k in target_kernels(abstract, lora)),
          "adapters": count(adapters)}


def sampler_update_bytes(config: DecoderConfig, lora: LoraConfig, *,
                         sampler_dtype: str = "bfloat16", adapter_dtype: str = "float32",
                         head: str = "lm") -> dict[str, int]:
  """Bytes a sampler receives per policy update, three ways.

  Returns:
    {"merged_full": every parameter in `sampler_dtype` (a full weight push),
    "merged_targets": only the adapted kernels (+ modules_to_save) merged, in
    `sampler_dtype` (the rest of the model never changes under LoRA),
    "adapters": the adapters in `adapter_dtype` (the sampler merges them itself)}.
  """
  sizes = lora_sizes(config, lora, head)
  low_rank = sizes["adapters"]
  extra = 0
  if lora.modules_to_save:
    _, abstract = init_model(config, head=head, abstract=True)
    extra = sum(math.prod(x.shape) for name in lora.modules_to_save
                for x in jax.tree.leaves(abstract[name]))
  sampler, adapter = np.dtype(sampler_dtype).itemsize, np.dtype(adapter_dtype).itemsize
  return {"merged_full": sizes["model"] * sampler,
          "merged_targets": (sizes["targets"] + extra) * sampler,
          "adapters": low_rank * adapter}
