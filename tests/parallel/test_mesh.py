"""Mesh-size resolution and the single-device mesh (parallel/mesh.py; no emulation needed)."""

import pytest

from rlhf_jax import parallel


def test_minus_one_takes_the_rest():
  assert parallel.resolve_axis_sizes({"data": -1, "fsdp": 2, "tensor": 2}, 16) == {
      "data": 4, "fsdp": 2, "expert": 1, "tensor": 2}
  assert parallel.resolve_axis_sizes({"fsdp": -1}, 8) == {"data": 1, "fsdp": 8, "expert": 1,
                                                          "tensor": 1}
  assert parallel.resolve_axis_sizes({"data": 2, "expert": -1}, 8)["expert"] == 4


@pytest.mark.parametrize("sizes,devices,message", [
    ({"data": -1, "fsdp": -1}, 8, "only one mesh axis may be -1"),
    ({"data": 3, "tensor": -1}, 8, "not a multiple of 3"),
    ({"data": 2, "fsdp": 2}, 8, "has 4 devices but 8 are available"),
    ({"data": 0}, 8, r"mesh.data=0 must be a positive int"),
    ({"pipeline": 2}, 8, "unknown mesh axis 'pipeline'"),
])
def test_bad_sizes_are_named(sizes, devices, message):
  with pytest.raises(ValueError, match=message):
    parallel.resolve_axis_sizes(sizes, devices)


def test_single_device_mesh():
  mesh = parallel.make_mesh()
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
  assert "data=1" in parallel.describe(mesh)
