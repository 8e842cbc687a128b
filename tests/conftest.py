"""Test-wide settings: strict rank promotion, deterministic hypothesis runs."""

import contextlib
import os
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU, exact-resume and equality tests need XLA's deterministic reductions
# (`train.deterministic`); set before JAX starts. No effect on CPU.
if "--xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_gpu_deterministic_ops=true").strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Implicit rank promotion hides [B] vs [B, T] broadcasting bugs; tests forbid it.
jax.config.update("jax_numpy_rank_promotion", "raise")

# Few examples, fixed seed: property tests stay quick and never flake in CI.
settings.register_profile("rlhf_jax", max_examples=25, deadline=None, derandomize=True,
                          print_blob=True)
settings.load_profile("rlhf_jax")

# Three suites, one per pytest process (scripts/test.sh), chosen with --suite and told apart by
# markers: `multidevice` (tests/multidevice: 8 emulated devices, fixed before JAX starts) and
# `adversarial` (hostile programs, run only inside a PID namespace of their own).
SUITES = ("main", "multidevice", "adversarial")


def pytest_addoption(parser):
  parser.addoption("--suite", default="main", choices=SUITES,
                   help="which suite to run: main (default), multidevice (with XLA_FLAGS="
                        "--xla_force_host_platform_device_count=8) or adversarial (inside "
                        "`unshare --pid --fork --mount-proc`); scripts/test.sh runs all three")


_INIT_PID_NAMESPACE = 0xEFFFFFFC  # the kernel's inode number of the initial PID namespace


def _in_own_pid_namespace() -> bool:
  """Whether this process runs in a PID namespace of its own: not the one its launcher
  ran in (scripts/test.sh exports that as RLHF_JAX_OUTER_PIDNS), else not the host's."""
  outer = int(os.environ.get("RLHF_JAX_OUTER_PIDNS") or _INIT_PID_NAMESPACE)
  return os.stat("/proc/self/ns/pid").st_ino != outer


_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_ignore_collect(collection_path, config):
  """Skips the helper modules of tests/ (not test_*.py): `--doctest-modules` is for the
  library, tests/ holds no doctests, and collecting a helper imports it in every xdist
  worker (tests/rewards/slow_import_verifier.py sleeps 2 s on purpose)."""
  del config
  name = collection_path.name
  if (collection_path.suffix == ".py" and not name.startswith("test_")
      and name not in ("conftest.py", "__init__.py")
      and str(collection_path).startswith(_TESTS + os.sep)):
    return True
  return None


def pytest_collection_modifyitems(config, items):
  """Keeps the items of the selected suite (an unmarked item belongs to 'main')."""
  suite = config.getoption("--suite")
  for item in items:
    if "tests/multidevice/" in item.nodeid or item.nodeid.startswith("multidevice/"):
      item.add_marker("multidevice")
  keep, drop = [], []
  for item in items:
    marks = {m for m in SUITES[1:] if item.get_closest_marker(m)}
    (keep if (marks == {suite} if marks else suite == "main") else drop).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
  if suite == "adversarial" and keep and not _in_own_pid_namespace():
    raise pytest.UsageError("--suite=adversarial runs hostile programs: only inside a PID "
                            "namespace of its own (scripts/test.sh: unshare --pid --fork "
                            "--mount-proc --kill-child timeout 600 pytest ...)")

# The persistent compilation cache (runtime.enable_compile_cache): a second run of the
# suite loads the programs the first compiled (most of a test's time here is XLA's
# compile). Its own directory, so tests never share entries with launches;
# RLHF_JAX_TEST_COMPILE_CACHE="" turns it off.
from rlhf_jax.runtime import enable_compile_cache  # noqa: E402

enable_compile_cache(os.environ.get("RLHF_JAX_TEST_COMPILE_CACHE",
                                    "~/.cache/rlhf_jax/xla-tests"), min_compile_s=0.2)


# XLA:CPU keeps three memory maps per live executable; a process that compiles the whole
# suite crosses vm.max_map_count and dies with SIGSEGV (tests/memory_maps.py). After a
# test, past half the limit, JAX's caches are cleared (shared engines recompile from the
# persistent cache above); the run stops with the count when clearing cannot help.
# Counting reads /proc/self/maps (~25 ms at 20k maps), so it runs at most every
# CHECK_EVERY_S of tests: the fastest growth seen, ~600 maps/s, is far below the headroom.
from tests import memory_maps  # noqa: E402

_MAX_MAP_COUNT = memory_maps.max_map_count()
CHECK_EVERY_S = 2.0
_last_check = [0.0]


def pytest_runtest_teardown(item, nextitem):
  del nextitem
  now = time.monotonic()
  if now - _last_check[0] < CHECK_EVERY_S:
    return
  _last_check[0] = now
  try:
    cleared = memory_maps.relieve(_MAX_MAP_COUNT)
  except RuntimeError as error:
    pytest.exit(str(error), returncode=3)
  if not cleared:
    return
  message = (f"[memory maps] {cleared[0]} of vm.max_map_count={_MAX_MAP_COUNT} after "
             f"{item.nodeid}: cleared JAX's caches, {cleared[1]} left")
  reporter = item.config.pluginmanager.get_plugin("terminalreporter")
  if reporter is None or hasattr(item.config, "workerinput"):
    # an xdist worker's terminal is nobody's: its warnings reach the controller's summary
    warnings.warn(message, pytest.PytestWarning)
    return
  # teardown output is captured (and dropped for a passing test): write past the capture
  capture = item.config.pluginmanager.get_plugin("capturemanager")  # None: -p no:capture
  with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
    reporter.write_line("\n" + message)
