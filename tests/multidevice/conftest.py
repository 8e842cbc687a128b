"""Fails loudly when this directory runs without its 8 emulated devices."""

import jax
import pytest

DEVICES = 8


@pytest.fixture(autouse=True, scope="session")
def eight_devices():
  if jax.device_count() != DEVICES:
    pytest.fail(f"tests/multidevice needs {DEVICES} devices, found {jax.device_count()}: run "
                "with XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh).")
