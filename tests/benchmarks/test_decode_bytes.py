"""benchmarks/decode_bytes.py on a tiny model: XLA's bytes per decode step stay within a
stated factor of the roofline ideal, and grow with the used span of a large cache."""

import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "decode_bytes.py"
# float32, 2 layers, a 512-slot cache of which 64 or 448 slots are used by every row.
TINY = {"tiny": (dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, intermediate_size=128),
                 8, 512, (64, 448))}


@pytest.fixture(scope="module")
def records():
  spec = importlib.util.spec_from_file_location("decode_bytes", PATH)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  return {used: bench.measure("tiny", used, shapes=TINY) for used in (64, 448)}


def test_bytes_per_step_are_within_a_factor_of_the_ideal(records):
  full = records[448]
  # Measured (XLA:CPU, jax 0.10): ratio 4.98, 3.13 without the writes. What the factor
  # pays for: the cost model counts each in-place cache write as the whole buffer read
  # and written (2 × 512 slots against 448 live), the attention materialises the used
  # prefix of K and V (sliced copy, then read: ~3.4 passes over the live cache), and the
  # small weights are read about twice. Bounds leave ~20 % for compiler drift; a step
  # that copied the whole cache once more (or read it in float32 twice) would fail.
  assert full["ratio"] <= 6.0, full
  assert full["without_writes_ratio"] <= 4.0, full
  assert full["bytes_accessed"] >= full["ideal_bytes"], full  # the ideal is a floor


def test_bytes_grow_with_the_used_span_not_the_cache_size(records):
  """64 vs 448 of 512 slots used: had decode read the whole cache regardless, both steps
  would cost the same; it costs about 1× to 5× the extra live cache (measured 3.4× on
  XLA:CPU: the prefix copy and its reads; 0.997× on XLA:GPU, jax 0.11, which fuses the
  attention and reads the live span once: the 5 % slack is for that cost model's
  rounding)."""
  short, long = records[64], records[448]
  grown = long["bytes_accessed"] - short["bytes_accessed"]
  extra_kv = long["kv_bytes"] - short["kv_bytes"]
  assert 0.95 * extra_kv <= grown <= 5 * extra_kv, (short, long)
  assert short["weight_bytes"] == long["weight_bytes"]


def test_sampling_reads_the_logits_once():
  """The sampling step on float32 [64, 32768] logits, truncation off (the engine's usual
  variant): one fused pass over the logits, block-sized work besides. Measured (XLA:CPU):
  1.00× in the pass, 2.15× in all for the 0.5B shape (before: 17.1×, a cumsum over V and
  ~10 passes): XLA:CPU's cost model charges the per-row block gather its whole operand
  (another 1.0×), though it reads batch × block."""
  spec = importlib.util.spec_from_file_location("decode_bytes", PATH)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  shapes = {"v32k": (dict(vocab_size=32768), 64, 0, ())}
  record = bench.measure_sampling("v32k", False, shapes=shapes)
  logits_mb = record["logits_bytes"] / 1e6
  parts = record["breakdown_mb"]
  assert parts["logits_pass"] <= 1.05 * logits_mb, record
  assert parts["gather"] <= 1.05 * logits_mb, record
  assert record["bytes_accessed"] - parts["gather"] * 1e6 <= 1.3 * record["logits_bytes"], record
