"""rlhf_jax.algorithms: per family, its config section, its (prepare, loss) from kernels
and its `Learner` (learner.py: the protocol and shared base; registry.py picks one by
`algorithm.learner`): the PPO family (ppo_config, ppo_family, ppo_learner), DPO, DQO,
SFT and Q♯ fitting; batch.py is the rollout batch every family trains on."""
