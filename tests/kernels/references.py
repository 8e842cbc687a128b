"""NumPy references written from the formulas, shared by the kernel tests."""

import numpy as np


def reward_to_go(rewards, mask, gamma=1.0):
  """Σ_{k≥t} γ^(k−t) r_k over the kept tokens of each row (masked tokens carry nothing)."""
  out = np.zeros(rewards.shape)
  for i in range(rewards.shape[0]):
    running = 0.0
    for t in reversed(range(rewards.shape[1])):
      if mask[i, t] > 0:
        running = rewards[i, t] + gamma * running
        out[i, t] = running
  return out


def kl_reference(logp, ref_logp, estimator):
  """The KL estimators per token (Schulman's k1, k2, k3, |δ|) in float64, with the kernels' clips."""
  delta = logp.astype(np.float64) - ref_logp
  base = estimator.rstrip("+")
  if base == "k1":
    return delta
  if base == "k2":
    return 0.5 * delta**2
  if base == "abs":
    return np.abs(delta)
  log_ratio = np.clip(-delta, -20, 20)
  return np.clip(np.exp(log_ratio) - log_ratio - 1, -10, 10)


def aggregate_reference(loss, mask, mode, horizon=None):
  """The loss aggregation modes (token-mean, token-sum, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm)."""
  rows = [i for i in range(loss.shape[0]) if mask[i].sum() > 0]
  row_sums = [float(np.sum(loss[i] * mask[i])) for i in rows]
  if mode == "token-sum":
    return float(np.sum(loss * mask))
  if mode == "token-mean":
    return float(np.sum(loss * mask) / max(mask.sum(), 1e-8))
  if not rows:
    return 0.0
  if mode == "seq-mean-token-mean":
    return float(np.mean([row_sums[k] / mask[i].sum() for k, i in enumerate(rows)]))
  if mode == "seq-mean-token-sum":
    return float(np.mean(row_sums))
  return float(np.mean(row_sums) / (loss.shape[1] if horizon is None else horizon))
