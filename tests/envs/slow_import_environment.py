"""An environment whose module takes 2 s to import (as one importing jax may on a busy
machine): the runner's workers import it while they start, not within a reset's time limit."""

import time

from tests.envs.environments import Countdown

time.sleep(2.0)


class SlowToImport(Countdown):
  """Countdown, from a module slow to import."""
