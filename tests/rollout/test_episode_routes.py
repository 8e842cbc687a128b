"""A mixture-of-experts sampler's routes in multi-turn episodes: each model turn's routes
sit at its tokens' columns of the row, observations get NOT_RECORDED (the trainer routes
them live, as its prefill did), and a row without any recorded turn has none."""

from __future__ import annotations

import numpy as np

from rlhf_jax.data import Example
from rlhf_jax.models import moe
from rlhf_jax.rollout.multi_turn import Episode
from rlhf_jax.rollout.multi_turn import pack_episodes

L, K = 3, 2


def _episode(rng, turns):
  """An episode of ("assistant" | "environment", n tokens, recorded) turns."""
  episode = Episode(example=Example(prompt="p", answer="a", task="echo"), prompt_ids=[1, 2])
  expected = []
  for role, n, recorded in turns:
    routes = rng.integers(0, 8, (n, L, K)).astype(np.int8) if recorded else None
    episode.append(role, list(rng.integers(3, 30, n)), "t", [0.0] * n, [0] * n,
                   routes=routes)
    expected.append(routes if routes is not None
                    else np.full((n, L, K), moe.NOT_RECORDED, np.int8))
  return episode, np.concatenate(expected)


def test_model_turns_bring_their_routes_and_observations_none():
  rng = np.random.default_rng(0)
  first, first_routes = _episode(rng, [("assistant", 3, True), ("environment", 2, False),
                                       ("assistant", 4, True)])
  second, _ = _episode(rng, [("assistant", 2, False), ("environment", 3, False)])
  assert second.route_rows() is None
  rollouts = pack_episodes([first, second], [1.0, 0.0], prompt_length=4, response_length=12,
                           pad_id=0, group_size=2, turn_rewards=False)
  routes = np.asarray(rollouts.batch.routes)
  assert routes.shape == (2, 16, L, K)
  np.testing.assert_array_equal(routes[0, 4:4 + 9], first_routes)
  rest = np.ones((2, 16), bool)
  rest[0, 4:4 + 9] = False
  assert (routes[rest] == moe.NOT_RECORDED).all()
  # the observation's columns (3, 4 of the response) hold nothing recorded
  assert (routes[0, 4 + 3:4 + 5] == moe.NOT_RECORDED).all()
