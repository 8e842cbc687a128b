"""One error type for bad configuration, shared by every module that owns a config section.

A `ConfigError` names the full field path (`config.algorithm.kl.coef=-1 must be >= 0`);
launchers print it as one line, without a traceback, and exit with status 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
  """An impossible config value; the message starts with the field's full path."""


def fail(field: str, message: str) -> None:
  """Raises ConfigError for `config.<field>`; `message` starting with "=" follows the
  field directly (`config.a.b=3 must be ...`), otherwise after a space."""
  raise ConfigError(f"config.{field}{'' if message.startswith('=') else ' '}{message}.")
