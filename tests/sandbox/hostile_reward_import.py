"""A reward module whose import sends the trainer a crafted pickle through the worker's
pipe (tests/sandbox/test_reward_workers_adversarial.py)."""

import os
import pickle

from tests.sandbox.hostile_rewards import _parent_connection


class _Payload:
  def __reduce__(self):
    return (os.system, (f"touch {os.environ['HOSTILE_MARKER']}",))


_parent_connection().send_bytes(pickle.dumps(_Payload()))


def score(prompts, completions, **kwargs):
  return [1.0] * len(completions)
