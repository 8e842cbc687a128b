"""A reward module whose import sends the trainer a crafted pickle through the worker's
pipe (tests/sandbox/test_workers.py). Imported anywhere else (pytest's
doctest collection) it finds no pipe and sends nothing."""

import os
import pickle

from tests.sandbox.hostile_rewards import _parent_connection


class _Payload:
  def __reduce__(self):
    return (os.system, (f"touch {os.environ['HOSTILE_MARKER']}",))


try:
  _CONNECTION = _parent_connection()
except RuntimeError:  # not in a worker
  _CONNECTION = None
if _CONNECTION is not None:
  _CONNECTION.send_bytes(pickle.dumps(_Payload()))


def score(prompts, completions, **kwargs):
  return [1.0] * len(completions)
