"""Token log-probs and entropy from logits (with temperature) against a float64 NumPy
log-softmax."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from jax.test_util import check_grads

from rlhf_jax import kernels


def log_softmax_reference(logits, tokens, temperature=1.0):
  z = logits.astype(np.float64) / temperature
  z = z - z.max(axis=-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
  return np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0], logp


class LogprobsTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1.0, 0.7, 30.0)
  def test_token_logprobs(self, temperature):
    rng = np.random.default_rng(51)
    logits = (5 * rng.standard_normal((2, 3, 37))).astype(np.float32)
    tokens = rng.integers(0, 37, (2, 3)).astype(np.int32)
    out = self.variant(functools.partial(kernels.token_logprobs, temperature=temperature))(
        logits, tokens)
    np.testing.assert_allclose(out, log_softmax_reference(logits, tokens, temperature)[0],
                               rtol=1e-5, atol=1e-5)

  def test_extreme_logits_are_finite(self):
    logits = np.array([[[1e4, -1e4, 0.0]]], np.float32)
    out = kernels.token_logprobs(logits, np.array([[1]], np.int32))
    np.testing.assert_allclose(out, [[-2e4]], rtol=1e-6)

  def test_custom_vjp_matches_autodiff_and_finite_differences(self):
    rng = np.random.default_rng(52)
    logits = rng.standard_normal((2, 3, 11)).astype(np.float32)
    tokens = rng.integers(0, 11, (2, 3)).astype(np.int32)
    weights = rng.standard_normal((2, 3)).astype(np.float32)

    def ours(x):
      return jnp.sum(weights * kernels.token_logprobs(x, tokens, temperature=0.8))

    def naive(x):
      logp = jax.nn.log_softmax(x / 0.8, axis=-1)
      return jnp.sum(weights * jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0])

    np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(naive)(logits), atol=1e-6)
    check_grads(ours, (logits,), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)

  def test_bfloat16_logits_and_gradient_dtype(self):
    rng = np.random.default_rng(53)
    logits = jnp.asarray(rng.standard_normal((2, 4, 64)), jnp.bfloat16)
    tokens = rng.integers(0, 64, (2, 4)).astype(np.int32)
    out = kernels.token_logprobs(logits, tokens)
    self.assertEqual(out.dtype, jnp.float32)
    ref, _ = log_softmax_reference(np.asarray(logits, np.float32), tokens)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    grad = jax.grad(lambda x: jnp.sum(kernels.token_logprobs(x, tokens)))(logits)
    self.assertEqual(grad.dtype, jnp.bfloat16)

  @parameterized.parameters("logprobs", "entropy")
  def test_no_float32_vocab_copies(self, which):
    # Forward and backward hold no [B,T,V] float32 temporary for float32 logits.
    # For bfloat16 logits XLA:CPU's reduce fusion will not take the bf16->f32
    # convert inside and materialises it; there we only require no more than
    # autodiff of the textbook formula.
    batch, time, vocab = 2, 8, 4096
    tokens = jnp.zeros((batch, time), jnp.int32)
    if which == "logprobs":
      ours = lambda x: jnp.sum(kernels.token_logprobs(x, tokens))
      naive = lambda x: jnp.sum(jnp.take_along_axis(
          jax.nn.log_softmax(x.astype(jnp.float32), axis=-1), tokens[..., None], axis=-1))
    else:
      ours = lambda x: jnp.sum(kernels.entropy_from_logits(x))
      naive = lambda x: jnp.sum(-jax.nn.softmax(x.astype(jnp.float32)) *
                                jax.nn.log_softmax(x.astype(jnp.float32)))
    buffer = batch * time * vocab * 4

    def temp_bytes(fn, dtype):
      compiled = jax.jit(fn).lower(jnp.zeros((batch, time, vocab), dtype)).compile()
      return compiled.memory_analysis().temp_size_in_bytes

    for fn in (ours, jax.grad(ours)):
      self.assertLess(temp_bytes(fn, jnp.float32), buffer // 8)
    if jax.default_backend() == "cpu":
      # The bound above can fail: XLA:CPU materialises the textbook formula's copy
      # (XLA:GPU fuses both into a few hundred bytes, so there the bound alone speaks).
      self.assertGreaterEqual(temp_bytes(jax.grad(naive), jnp.float32), buffer)
    self.assertLessEqual(temp_bytes(jax.grad(ours), jnp.bfloat16),
                         max(temp_bytes(jax.grad(naive), jnp.bfloat16), buffer // 8))

  def test_entropy_gradient(self):
    rng = np.random.default_rng(55)
    logits = rng.standard_normal((2, 3, 13)).astype(np.float32)
    weights = rng.standard_normal((2, 3)).astype(np.float32)

    def naive(x):
      logp = jax.nn.log_softmax(x / 1.3, axis=-1)
      return jnp.sum(weights * -jnp.sum(jnp.exp(logp) * logp, axis=-1))

    ours = lambda x: jnp.sum(weights * kernels.entropy_from_logits(x, temperature=1.3))
    np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(naive)(logits), atol=1e-6)
    check_grads(ours, (logits,), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)

  @chex.variants(with_jit=True, without_jit=True)
  def test_entropy(self):
    rng = np.random.default_rng(54)
    logits = (3 * rng.standard_normal((2, 5, 23))).astype(np.float32)
    _, logp = log_softmax_reference(logits, np.zeros((2, 5), np.int64))
    expected = -np.sum(np.exp(logp) * logp, axis=-1)
    np.testing.assert_allclose(self.variant(kernels.entropy_from_logits)(logits), expected,
                               rtol=1e-5, atol=1e-6)
    uniform = kernels.entropy_from_logits(np.zeros((1, 23), np.float32))
    np.testing.assert_allclose(uniform, [np.log(23)], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1.0, 0.7)
  def test_entropy_at_large_logits(self, temperature):
    # Logits of ±80..±240: lse − Σp·z without the max shift cancels two numbers
    # of that size (float32 ulp(80) ≈ 8e-6; the unshifted formula was off by
    # ~1e-5..1e-3 here). Rows with spreads of 0.3..3 have entropies of 2..5.5 nats,
    # where float32 resolves ~5e-7.
    rng = np.random.default_rng(56)
    offsets = np.array([-80.0, 80.0, 120.0, -120.0, 80.0, 0.0])[:, None]
    scales = np.array([1.0, 1.0, 3.0, 0.3, 40.0, 40.0])[:, None]
    logits = (offsets + scales * rng.standard_normal((6, 257))).astype(np.float32)
    logits = np.stack([logits, logits[::-1]])  # [2, 6, 257]
    self.assertGreaterEqual(np.abs(logits).max(), 80.0)
    _, logp = log_softmax_reference(logits, np.zeros((2, 6), np.int64), temperature)
    expected = -np.sum(np.exp(logp) * logp, axis=-1)
    self.assertGreater(expected.max(), 4.0)
    out = self.variant(functools.partial(kernels.entropy_from_logits,
                                         temperature=temperature))(logits)
    self.assertEqual(out.dtype, jnp.float32)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)

  @parameterized.parameters(1.0, 0.7)
  def test_entropy_gradient_at_large_logits(self, temperature):
    # Analytic reference in float64: ∂H/∂x = −p·(log p + H) / τ.
    rng = np.random.default_rng(58)
    offsets = np.array([[-80.0], [80.0], [150.0]])
    logits = (offsets + 2.0 * rng.standard_normal((3, 257))).astype(np.float32)
    weights = np.array([0.5, -1.0, 2.0], np.float32)
    _, logp = log_softmax_reference(logits, np.zeros(3, np.int64), temperature)
    probs = np.exp(logp)
    entropy = -np.sum(probs * logp, axis=-1, keepdims=True)
    expected = -weights[:, None] * probs * (logp + entropy) / temperature
    grad = jax.grad(lambda x: jnp.sum(
        weights * kernels.entropy_from_logits(x, temperature=temperature)))(logits)
    self.assertEqual(grad.dtype, jnp.float32)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)

  def test_shape_and_type_errors(self):
    with self.assertRaisesRegex(ValueError, "one more axis"):
      kernels.token_logprobs(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int32))
    with self.assertRaisesRegex(TypeError, "tokens must be an integer"):
      kernels.token_logprobs(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32))
    with self.assertRaisesRegex(ValueError, "temperature=0"):
      kernels.token_logprobs(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.int32),
                             temperature=0)

if __name__ == "__main__":
  absltest.main()
