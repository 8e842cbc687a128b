"""models/attention/choice.py: what "auto" means on each backend, for the training and
scoring forwards (the cuDNN, Pallas and XLA kernels by dtype, length, softcap and window)
and for a one-token decode step, and how the GPU is recognised. The GPU is faked: the
backend's name, the first device's compute capability and its client's platform."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import pytest

from rlhf_jax.models.attention import choice as kernel_choice


def test_auto_is_xla_on_cpu():
  assert kernel_choice.training_attention("auto") == "xla"
  assert kernel_choice.training_attention("pallas") == "pallas"


@pytest.mark.parametrize("dtype, time, options, hopper, want", [
    (jnp.bfloat16, 1024, {}, True, "cudnn"),
    (jnp.bfloat16, 1024, {}, False, "pallas"),     # packed cuDNN needs Hopper
    (jnp.float32, 1024, {}, True, "xla"),          # cuDNN: bf16/fp16; Triton: TF32
    (jnp.bfloat16, 1023, {}, True, "pallas"),      # cuDNN: even lengths only
    (jnp.float16, 1024, {}, False, "pallas"),
    (jnp.bfloat16, 1024, dict(softcap=30.0), True, "xla"),
    (jnp.bfloat16, 1024, dict(window=512), True, "xla"),
    (jnp.bfloat16, 1024, dict(window=4096), True, "cudnn"),
])
def test_auto_on_a_gpu(monkeypatch, dtype, time, options, hopper, want):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(kernel_choice, "_cudnn_hopper", lambda: hopper)
  monkeypatch.setattr(kernel_choice, "_on_nvidia_gpu", lambda: True)
  assert kernel_choice.training_attention("auto") == "auto"  # decided with the arrays
  assert kernel_choice.training_attention("auto", dtype=dtype, head_dim=64, time=time,
                                          **options) == want


@pytest.mark.parametrize("backend, want", [("cpu", "xla"), ("tpu", "xla"), ("gpu", "pallas")])
def test_decode_auto_is_the_ragged_kernel_on_a_gpu_only(monkeypatch, backend, want):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  assert kernel_choice.decode_attention("auto") == want
  assert kernel_choice.decode_attention("xla") == "xla"
  assert kernel_choice.decode_attention("pallas") == "pallas"
  # A conditional per layer is cheap off a GPU and a host synchronisation on one.
  assert kernel_choice.decode_span_switch() == (backend != "gpu")


def fake_device(capability=None, platform_version=""):
  """A stand-in for `jax.devices()[0]`: its compute capability (None: the attribute is
  absent, as on a CPU) and its client's platform version."""
  device = types.SimpleNamespace(client=types.SimpleNamespace(
      platform_version=platform_version))
  if capability is not None:
    device.compute_capability = capability
  return device


@pytest.mark.parametrize("capability, hopper", [
    ("9.0", True), ("10.0", True), ("8.9", False), ("8.0", False),
    ("gfx90a", False),  # ROCm names its architecture, not an NVIDIA capability
    (None, False),
])
def test_hopper_is_compute_capability_nine_or_later(monkeypatch, capability, hopper):
  monkeypatch.setattr(jax, "devices", lambda: [fake_device(capability)])
  assert kernel_choice._cudnn_hopper() is hopper


@pytest.mark.parametrize("backend, platform_version, nvidia", [
    ("gpu", "PJRT C API\ncuda 12080", True),
    ("gpu", "PJRT C API\nrocm 60342", False),
    ("cpu", "cuda 12080", False),  # not traced for a GPU, whatever the devices say
])
def test_an_nvidia_gpu_is_told_by_its_platform(monkeypatch, backend, platform_version,
                                               nvidia):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  monkeypatch.setattr(jax, "devices", lambda: [fake_device("9.0", platform_version)])
  assert kernel_choice._on_nvidia_gpu() is nvidia
  if not nvidia:  # off NVIDIA GPUs "auto" is XLA, whatever the attention
    assert kernel_choice.training_attention("auto", dtype=jnp.bfloat16, head_dim=64,
                                            time=1024) == "xla"
