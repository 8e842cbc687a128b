"""rlhf_jax.batch: the rollout batch, the shared vocabulary of rollout, rewards, tasks,
search and the learners — fixed-shape arrays built from the sampler's completions
(rollout_batch.py), the batch a learner trains on, those arrays plus what `prepare`
adds (train_batch.py), and the model forwards that read them (forwards.py)."""

from rlhf_jax.batch.forwards import response_logprobs
from rlhf_jax.batch.forwards import response_values
from rlhf_jax.batch.rollout_batch import RolloutBatch
from rlhf_jax.batch.rollout_batch import as_device
from rlhf_jax.batch.rollout_batch import build_rollout_batch
from rlhf_jax.batch.rollout_batch import encode_pairs
from rlhf_jax.batch.rollout_batch import only_packed_rows
from rlhf_jax.batch.train_batch import TrainBatch

__all__ = ["RolloutBatch", "TrainBatch", "as_device", "build_rollout_batch", "encode_pairs",
           "only_packed_rows", "response_logprobs", "response_values"]
