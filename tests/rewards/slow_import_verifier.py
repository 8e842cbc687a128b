"""A verifier whose module takes 2 s to import (as one importing jax may on a busy machine):
the router's workers import it while they start, not within a sample's time limit."""

import time

time.sleep(2.0)


def always_right(response, answer):
  """Correct whatever the response."""
  del response, answer
  return True
