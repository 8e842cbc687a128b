"""Test-wide settings: strict rank promotion, deterministic hypothesis runs."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU, exact-resume and equality tests need XLA's deterministic reductions
# (`train.deterministic`); set before JAX starts. No effect on CPU.
if "--xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_gpu_deterministic_ops=true").strip()

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402

# Implicit rank promotion hides [B] vs [B, T] broadcasting bugs; tests forbid it.
jax.config.update("jax_numpy_rank_promotion", "raise")

# Few examples, fixed seed: property tests stay quick and never flake in CI.
settings.register_profile("rlhf_jax", max_examples=25, deadline=None, derandomize=True,
                          print_blob=True)
settings.load_profile("rlhf_jax")

# tests/multidevice needs 8 emulated devices, fixed before JAX starts: scripts/test.sh runs
# it in its own pytest process with XLA_FLAGS and RLHF_JAX_MULTIDEVICE=1.
collect_ignore = [] if os.environ.get("RLHF_JAX_MULTIDEVICE") == "1" else ["multidevice"]

# The persistent compilation cache (runtime.enable_compile_cache): a second run of the
# suite loads the programs the first compiled (most of a test's time here is XLA's
# compile). Its own directory, so tests never share entries with launches;
# RLHF_JAX_TEST_COMPILE_CACHE="" turns it off.
from rlhf_jax.runtime import enable_compile_cache  # noqa: E402

enable_compile_cache(os.environ.get("RLHF_JAX_TEST_COMPILE_CACHE",
                                    "~/.cache/rlhf_jax/xla-tests"), min_compile_s=0.2)
