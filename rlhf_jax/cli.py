"""What every launcher shares: config errors as one line, and process setup.

`run(main)` is `absl.app.run(main)` that turns a bad config into one line on
stderr naming the full field path, and exit status 2, instead of a traceback:

  * a value no validator accepts (`ConfigError`, raised before anything compiles);
  * an unknown field on the command line (`--config.algorithm.bogus=1`), which
    ml_collections reports as a bare `AttributeError: 'bogus'`;
  * a value of the wrong type (`--config.train.steps=abc`).
"""

from __future__ import annotations

import re
import sys
from typing import Callable

from rlhf_jax.config_errors import ConfigError

_CONFIG_FLAG = re.compile(r"^--(config(?:\.[A-Za-z0-9_]+)+)(?:=(.*))?$")


def _unknown_field(argv: list[str], error: BaseException) -> str | None:
  """The one-line message for a command-line config override that failed to apply."""
  for argument in argv[1:]:
    match = _CONFIG_FLAG.match(argument)
    if match is None:
      continue
    path = match.group(1)
    name = path.rsplit(".", 1)[1]
    if name in str(error):
      return (f"{path}: no such config field ({type(error).__name__}: {error}); see the "
              "preset file and rlhf_jax/training/config.py for the fields")
  return None


def run(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)` with config errors reported in one line (exit status 2)."""
  from absl import app
  try:
    app.run(main)
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError, TypeError, ValueError) as error:
    message = _unknown_field(sys.argv, error)
    if message is None:
      raise
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def enable_deterministic_gpu_ops() -> None:
  """Adds `--xla_gpu_deterministic_ops=true` to XLA_FLAGS (before JAX starts)."""
  import os
  flag = "--xla_gpu_deterministic_ops=true"
  flags = os.environ.get("XLA_FLAGS", "")
  if flag not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
