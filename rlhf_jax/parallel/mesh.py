"""Device meshes with the named axes `data`, `fsdp`, `expert` and `tensor` (multi-host
start-up: parallel/distributed.py)."""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import jax
import numpy as np

# `expert` splits a mixture of experts' expert weights (expert parallelism,
# models/moe/parallel.py) and, like data and fsdp, the batch rows.
MESH_AXES = ("data", "fsdp", "expert", "tensor")


def resolve_axis_sizes(sizes: dict[str, int], num_devices: int) -> dict[str, int]:
  """Fills in a single −1 size so that the axes multiply to `num_devices`.

  Args:
    sizes: {axis: size} for each of MESH_AXES; one size may be −1.
    num_devices: devices to cover.
  Returns:
    The sizes with −1 resolved.
  Raises:
    ValueError naming the axis when a size is invalid or the product does not
    match the device count.
  """
  unknown = [axis for axis in sizes if axis not in MESH_AXES]
  if unknown:
    raise ValueError(f"unknown mesh axis {unknown[0]!r}; allowed: {', '.join(MESH_AXES)}.")
  sizes = {axis: sizes.get(axis, 1) for axis in MESH_AXES}
  for axis, size in sizes.items():
    if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
      raise ValueError(f"mesh.{axis}={size!r} must be a positive int or -1 (take the rest).")
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise ValueError(f"only one mesh axis may be -1; got {', '.join(free)}.")
  known = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if num_devices % known:
      raise ValueError(f"mesh {sizes} cannot cover {num_devices} devices: {num_devices} is not "
                       f"a multiple of {known}.")
    sizes[free[0]] = num_devices // known
  if math.prod(sizes.values()) != num_devices:
    raise ValueError(f"mesh {sizes} has {math.prod(sizes.values())} devices but "
                     f"{num_devices} are available; set one axis to -1 to take the rest.")
  return sizes


def make_mesh(*, data: int = -1, fsdp: int = 1, tensor: int = 1, expert: int = 1,
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A `jax.sharding.Mesh` over (data, fsdp, expert, tensor) with Auto axis types.

  The tensor axis is innermost so that tensor-parallel collectives stay on the
  fastest links (within a host / ICI ring), and the expert axis next to it: its token
  exchange runs once per sparse layer.

  Args:
    data: size of the data axis; one of the sizes may be −1 (the rest of the devices).
    fsdp: size of the fsdp axis.
    tensor: size of the tensor axis.
    expert: size of the expert axis (expert parallelism; 1: experts are not split).
    devices: devices to use (default: all, across hosts).
  Returns:
    The mesh.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = resolve_axis_sizes({"data": data, "fsdp": fsdp, "expert": expert,
                              "tensor": tensor}, len(devices))
  shape = tuple(sizes[axis] for axis in MESH_AXES)
  return jax.make_mesh(shape, MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def expert_parallel_context(mesh: jax.sharding.Mesh):
  """`jax.set_mesh(mesh)` when the mesh splits experts (an expert axis > 1), else no
  context. A sparse layer traced under it exchanges its tokens between the expert shards
  (models/moe/parallel.py reads the traced mesh); every other layer is laid out by its
  arguments' shardings and needs no context mesh."""
  if dict(mesh.shape).get("expert", 1) == 1:
    return contextlib.nullcontext()
  return jax.set_mesh(mesh)


def describe(mesh: jax.sharding.Mesh) -> str:
  """'data=2 fsdp=2 expert=1 tensor=2 on 8 cpu devices'."""
  sizes = " ".join(f"{name}={size}" for name, size in mesh.shape.items())
  platform = np.asarray(mesh.devices).flat[0].platform
  return f"{sizes} on {mesh.devices.size} {platform} devices"
