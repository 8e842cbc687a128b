"""What every launcher shares: config errors as one line, and process setup.

`run(main)` is `absl.app.run(main)` that reports a bad config as one line on stderr,
`error: config.<full.path>: ...`, with exit status 2 instead of a traceback:

  * an unknown field (`--config.rollout.temprature=1`): "unknown field", with the close
    matches among the section's fields (or all of them). Every `--config.<path>` override
    is checked against the preset's config tree before absl applies any of them.
  * a value of the wrong type (`--config.train.steps=abc`): "invalid value 'abc':
    expected an int", found by re-parsing each override with its field's parser.
  * a value no validator accepts: the `ConfigError` of `validate_config`, which every
    launcher calls first in main, before anything loads, trains or compiles.
  * a config file that is missing, not a .py file, or does not compile, or whose code
    fails (`check_config_file`); any other flag error absl reports (an unknown
    or missing flag): one line with absl's message.
  * a data file, checkpoint or workdir the launcher's own checks refuse
    (models/hf/checks.py, training/inputs.check_data): one line naming it.

The classification reads the config tree and the flags' parsers, never the text of
the exception absl or ml_collections raised.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import traceback
from typing import Any, Callable, NamedTuple

import ml_collections

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import peer_hint
from rlhf_jax.config_errors import unknown_field

_EXPECTED = {bool: "true or false", int: "an int", float: "a number", str: "a string",
             tuple: "a tuple, e.g. '(1, 2)' or '1,2'"}


class Override(NamedTuple):
  """One `--<flag>.<path>[=value]` argument."""
  flag: str  # the config flag's name, e.g. "config"
  path: str  # the dotted field path below it
  value: str | None  # the text after "=", or None (a bare boolean, or "--flag value")
  negated: bool  # the `--noconfig.a.b` form of a boolean
  index: int  # position in argv


def config_overrides(argv: list[str], flag: str = "config") -> list[Override]:
  """The `--<flag>.<path>` overrides in `argv`, in order."""
  pattern = re.compile(rf"^--?(?P<no>no)?{re.escape(flag)}\.(?P<path>[^=]+)(?:=(?P<value>.*))?$",
                       re.DOTALL)
  overrides = []
  for index, argument in enumerate(argv):
    match = pattern.match(argument)
    if match:
      overrides.append(Override(flag, match["path"], match["value"], bool(match["no"]), index))
  return overrides


# Fields that are gone, and what replaced them (the hint of their unknown-field error).
RETIRED_FIELDS = {"variant": "the variant is now the preset's overlay: "
                             "--config=configs/<preset>.py:arith (or :hf, :hf,cpu)"}


def _lookup(config, path: str) -> tuple[Any, str]:
  """(the section holding the field at `path`, the field's name); ConfigError naming
  the path as an unknown field when a part of it is not in the tree."""
  node, parts = config, path.split(".")
  for depth, part in enumerate(parts):
    name = part.split("[", 1)[0]  # config_path's `field[0]` indexing
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      parent = ".".join(parts[:depth])
      unknown_field(".".join(parts[:depth + 1]), (), f"config.{parent} is a value "
                    f"({type(node).__name__}), not a section")
    if name not in node:  # a peer's name (TRL's num_generations) gets our field's
      hint = peer_hint(path, lambda field: _has_field(config, field))
      if depth == 0 and name in RETIRED_FIELDS:
        hint = RETIRED_FIELDS[name]
      if hint is None and not difflib.get_close_matches(name, list(node.keys()), cutoff=0.6):
        hint = _elsewhere(config, name)  # a field of another section: config.temperature
      unknown_field(".".join(parts[:depth + 1]), node.keys(), hint or "")
    if depth == len(parts) - 1:
      return node, name
    node = node[name]
  raise AssertionError(path)  # unreachable: the loop returns at the last part


def _elsewhere(config, name: str) -> str | None:
  """"did you mean 'config.<section>.<name>'?" for the fields (at most three) of that name
  in other sections of `config`; None when there is none."""
  found = []

  def visit(node, prefix: str) -> None:
    for key, value in node.items():
      if isinstance(value, (ml_collections.ConfigDict, dict)):
        visit(value, f"{prefix}{key}.")
      elif key == name:
        found.append(f"'config.{prefix}{key}'")

  visit(config, "")
  return f"did you mean {' or '.join(found)}?" if 0 < len(found) <= 3 else None


def _has_field(config, path: str) -> bool:
  """Whether the dotted `path` is a field of `config`."""
  node = config
  for part in path.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return False
    node = node[part]
  return True


def _field_type(section, name: str) -> type:
  if isinstance(section, ml_collections.ConfigDict):
    return section.get_type(name)
  return type(section[name])


def _expected(field_type: type, path: str) -> str:
  if isinstance(field_type, type) and issubclass(field_type, (ml_collections.ConfigDict, dict)):
    return f"a section: set its fields instead (--config.{path}.<field>=...)"
  return _EXPECTED.get(field_type, getattr(field_type, "__name__", str(field_type)))


def _preset_spec(argv: list[str], name: str) -> str | None:
  """The value of the last `--<name>=<spec>` (or `--<name> <spec>`) in `argv`."""
  spec = None
  for index, argument in enumerate(argv):
    if argument in (f"-{name}", f"--{name}") and index + 1 < len(argv):
      spec = argv[index + 1]
    elif argument.startswith((f"-{name}=", f"--{name}=")):
      spec = argument.split("=", 1)[1]
  return spec


def check_config_file(spec: str, flag: str = "config") -> None:
  """`--<flag>=<spec>` (`file.py[:base[,overlay]]`) names an existing Python file that compiles."""
  path = spec.split(":", 1)[0]
  where = f"--{flag}={spec}"
  if not path:
    raise ConfigError(f"{where}: no config file given (e.g. configs/grpo.py:arith)")
  if not os.path.isfile(path):
    missing = "is a directory" if os.path.isdir(path) else "no such file"
    raise ConfigError(f"{where}: {path}: {missing} (a preset is configs/<name>.py[:arith|:hf])")
  if not path.endswith(".py"):
    raise ConfigError(f"{where}: {path} is not a Python config file (a .py file with "
                      "get_config(), e.g. configs/grpo.py:arith)")
  try:
    with open(path, "rb") as f:
      compile(f.read(), path, "exec")
  except SyntaxError as error:
    raise ConfigError(f"{where}: {path}:{error.lineno}: syntax error: {error.msg}") from None
  except (OSError, ValueError) as error:  # unreadable, or NUL bytes / bad encoding
    raise ConfigError(f"{where}: {path} cannot be read as Python ({error})") from None


def _load_preset(flag_values, argv: list[str], name: str):
  """The config that `--<name>=<file>[:base[,overlay]]` in `argv` names, loaded as the flag
  loads it; None without one (or when the file does not load: absl reports that)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  spec = _preset_spec(argv, name)
  if spec is None:
    return None
  check_config_file(spec, name)  # exists, is .py, compiles: else one line naming it
  try:
    config = flag_values[name].parser.parse(spec)
  except ValueError as error:  # get_config's own ValueError (e.g. the base) is the cause
    cause = error.__context__ if isinstance(error.__context__, ValueError) else error
    raise ConfigError(f"--{name}={spec}: {cause}") from None
  except (TypeError, NameError, ImportError, AttributeError, KeyError) as error:
    # A mistake in the file's code (ml_collections re-raises a TypeError with the
    # traceback as its text: the original is the cause).
    cause = error.__context__ if type(error.__context__) is type(error) else error
    raise ConfigError(f"--{name}={spec}: {_where_raised(cause, spec)}"
                      f"{type(cause).__name__}: {cause}") from None
  except (flags.Error, OSError):
    return None
  return config if isinstance(config, ml_collections.ConfigDict) else None


def _where_raised(error: BaseException, spec: str) -> str:
  """"<file>:<line>: " of the innermost frame of `error` in the config file of `spec`."""
  path = os.path.abspath(spec.split(":", 1)[0])
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(f.filename) == path]
  return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def last_wins(argv: list[str], config, overrides: list[Override]) -> list[str]:
  """`argv` without the earlier of repeated overrides of one field: the last one wins, as
  for any flag (absl parses a tuple field's flag as a list flag, which appended them:
  `--config.x=(64,) --config.x=(112,)` gave (64, 112)). A "--config.x value" override
  drops its value argument with it."""
  latest = {override.path: override.index for override in overrides}
  dropped = set()
  for override in overrides:
    if latest[override.path] == override.index:
      continue
    dropped.add(override.index)
    if override.value is None and not override.negated:
      section, name = _lookup(config, override.path)
      if _field_type(section, name) is not bool:
        dropped.add(override.index + 1)
  return [argument for index, argument in enumerate(argv) if index not in dropped]


def check_overrides(config, overrides: list[Override]) -> None:
  """ConfigError for the first override whose path is not a field of `config`."""
  for override in overrides:
    _lookup(config, override.path)


def _check_values(flag_values, config, overrides: list[Override], argv: list[str]) -> None:
  """ConfigError for the first override whose text its field's parser rejects."""
  for override in overrides:
    section, name = _lookup(config, override.path)
    field_type = _field_type(section, name)
    value = override.value
    if value is None:
      if field_type is bool or override.negated:
        continue
      value = argv[override.index + 1] if override.index + 1 < len(argv) else None
    flag_name = f"{override.flag}.{override.path}"
    parser = flag_values[flag_name].parser if flag_name in flag_values else None
    if value is None:
      invalid(override.path, "", f"missing; expected {_expected(field_type, override.path)}")
    if parser is None:
      continue
    try:
      parser.parse(value)
    except Exception:  # pylint: disable=broad-except
      invalid(override.path, value, f"expected {_expected(field_type, override.path)}")


def parse_flags(argv: list[str], flag_values=None) -> list[str]:
  """absl's flag parsing with config overrides checked: an unknown field before
  anything is applied, a value its field cannot hold after; either is a ConfigError.
  Another flag error (an unknown flag, a value its parser rejects, a required flag
  missing) is a ConfigError with absl's message."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  # is_config_flag is meant for users but not re-exported by the package.
  from ml_collections.config_flags import config_flags  # pylint: disable=import-outside-toplevel
  flag_values = flags.FLAGS if flag_values is None else flag_values
  working_directory_on_path()  # before a preset file imports the user's modules
  expanded = flag_values.read_flags_from_files(argv, force_gnu=False)
  checked = []
  for name in [n for n in flag_values if config_flags.is_config_flag(flag_values[n])]:
    overrides = config_overrides(expanded, name)
    config = _load_preset(flag_values, expanded, name)  # also a bad base or overlay: one line
    if config is not None:
      check_overrides(config, overrides)
      expanded = last_wins(expanded, config, overrides)
      checked.append((config, config_overrides(expanded, name)))
  try:
    return flag_values(expanded)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as error:
    for config, overrides in checked:
      _check_values(flag_values, config, overrides, expanded)
    if not isinstance(error, flags.Error):
      raise
    raise ConfigError(f"{error} (--helpshort lists the flags)") from None


def working_directory_on_path() -> None:
  """Appends the working directory to sys.path (last: it shadows nothing installed), as
  `python script.py` users of TRL and verl expect their modules to import: a preset file's
  `import my_learner`, and every `module:name` field (registry.load_object does the
  same on its own, for Python callers)."""
  cwd = os.getcwd()
  if cwd not in sys.path and "" not in sys.path:
    sys.path.append(cwd)


def run(main: Callable[[list[str]], None], *, compile_cache: bool = True) -> None:
  """`absl.app.run(main)` with config errors reported in one line (exit status 2).
  `compile_cache`: turn on JAX's persistent compilation cache first (which imports JAX;
  False for a launcher that compiles nothing)."""
  from absl import app  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel

  def with_compile_cache(argv):
    if not compile_cache:
      return main(argv)
    from rlhf_jax.runtime import enable_compile_cache  # pylint: disable=import-outside-toplevel
    config = getattr(flags.FLAGS, "config", None) if "config" in flags.FLAGS else None
    enable_compile_cache(compile_cache_dir(config))
    return main(argv)

  try:
    app.run(with_compile_cache, flags_parser=parse_flags)
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def compile_cache_dir(config) -> str:
  """The persistent compilation cache directory of a launch: the config's
  `compile_cache` field ('' = off) when it has one, else $RLHF_JAX_COMPILE_CACHE
  (set it empty to turn the cache off), else `runtime.DEFAULT_COMPILE_CACHE`."""
  from rlhf_jax.runtime import DEFAULT_COMPILE_CACHE  # pylint: disable=import-outside-toplevel
  if config is not None and "compile_cache" in config:
    return config.compile_cache
  return os.environ.get("RLHF_JAX_COMPILE_CACHE", DEFAULT_COMPILE_CACHE)


def enable_deterministic_gpu_ops() -> None:
  """Adds `--xla_gpu_deterministic_ops=true` to XLA_FLAGS (before JAX starts)."""
  flag = "--xla_gpu_deterministic_ops=true"
  flags = os.environ.get("XLA_FLAGS", "")
  if flag not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
