"""Checks of the files a launcher is given, before any work: each raises a one-line
`ConfigError` naming the flag or config field, the file and what is wrong with it, which
`rlhf_jax.cli.run` prints as `error: ...` with exit status 2.

  * `check_config_file`: a `--config=<file>[:variant]` that exists, is a .py file and
    compiles (a missing file or a syntax error, not a 40-line traceback).
  * `check_checkpoint_dir`: an HF checkpoint directory whose config.json is a JSON object,
    whose safetensors files have a readable header and the length that header gives
    (a truncated download), whose shard index names existing shards, and, for a policy,
    whose tokenizer.json is there and is JSON. Only config.json, the index and each
    file's 8-byte length and JSON header are read.
  * `check_workdir`: a run directory that is a directory, or can be made one (no regular
    file in its place or above it).

Data files are read and checked by their readers (data/sources.py), whose errors name the
file and line; the launchers turn those into ConfigErrors naming the field.
"""

from __future__ import annotations

import json
import os
import struct
from typing import NoReturn

from rlhf_jax.config_errors import ConfigError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header (100 MB)


def check_config_file(spec: str, flag: str = "config") -> None:
  """`--<flag>=<spec>` (`file.py[:variant]`) names an existing Python file that compiles."""
  path = spec.split(":", 1)[0]
  where = f"--{flag}={spec}"
  if not path:
    raise ConfigError(f"{where}: no config file given (e.g. configs/grpo.py:arith)")
  if not os.path.isfile(path):
    missing = "is a directory" if os.path.isdir(path) else "no such file"
    raise ConfigError(f"{where}: {path}: {missing} (a preset is configs/<name>.py[:variant])")
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


def _json_object(path: str, where: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, UnicodeDecodeError) as error:
    raise ConfigError(f"{where}: {path} cannot be read ({error})") from None
  except json.JSONDecodeError as error:
    raise ConfigError(f"{where}: {path}:{error.lineno}: not JSON ({error.msg})") from None
  if not isinstance(value, dict):
    raise ConfigError(f"{where}: {path} is not a JSON object")
  return value


def check_safetensors(path: str, where: str) -> set[str]:
  """The tensor names of a safetensors file whose 8-byte header length, JSON header and
  size agree (the data ends where the header's largest offset says); ConfigError naming
  `where` and the file otherwise. Reads only the header."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if not 0 < length <= min(_MAX_HEADER, size - 8):
      raise ConfigError(f"{where}: {path}: not a safetensors file, or truncated (a "
                        f"{size}-byte file whose header length reads {length})")
    try:
      header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError):
      header = None
  if not isinstance(header, dict):
    raise ConfigError(f"{where}: {path}: the safetensors header is not a JSON object")
  tensors = {k: v for k, v in header.items() if k != "__metadata__"}
  try:
    end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
  except (TypeError, KeyError, IndexError, ValueError):
    raise ConfigError(f"{where}: {path}: a tensor of the safetensors header has no "
                      "data_offsets") from None
  if 8 + length + end != size:
    raise ConfigError(f"{where}: {path}: truncated or padded: the header gives "
                      f"{8 + length + end} bytes, the file has {size}")
  return set(tensors)


def check_checkpoint_dir(directory: str, where: str, *, tokenizer: bool = True,
                         weights: bool = True) -> None:
  """An HF checkpoint directory that loads (module docstring); `where` names the flag or
  field in the error ("--checkpoint=DIR", "config.model.checkpoint"). `tokenizer`: a
  policy's directory also holds tokenizer.json; `weights`: and its safetensors (not for a
  model served elsewhere, whose config and tokenizer alone are read here)."""
  if not os.path.isdir(directory):
    raise ConfigError(f"{where}: {directory}: "
                      f"{'not a directory' if os.path.exists(directory) else 'no such directory'}")
  if not os.path.exists(os.path.join(directory, "config.json")):
    _missing(directory, "config.json", where)
  _json_object(os.path.join(directory, "config.json"), where)
  if weights:
    _check_weights(directory, where)
  if tokenizer:
    path = os.path.join(directory, TOKENIZER)
    if not os.path.exists(path):
      _missing(directory, f"{TOKENIZER} (its tokenizer)", where)
    _json_object(path, where)


def _check_weights(directory: str, where: str) -> None:
  """model.safetensors, or the shard index and every shard it names, with sound headers."""
  index = os.path.join(directory, SAFETENSORS_INDEX)
  if os.path.exists(index):
    weight_map = _json_object(index, where).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ConfigError(f"{where}: {index} has no weight_map object")
    for shard in sorted(set(weight_map.values())):
      path = os.path.join(directory, str(shard))
      if not os.path.isfile(path):
        raise ConfigError(f"{where}: shard {path}, named in {SAFETENSORS_INDEX}, is missing")
      check_safetensors(path, where)
  elif os.path.exists(os.path.join(directory, SAFETENSORS)):
    check_safetensors(os.path.join(directory, SAFETENSORS), where)
  else:
    _missing(directory, f"{SAFETENSORS} (or {SAFETENSORS_INDEX})", where)


def _missing(directory: str, name: str, where: str) -> NoReturn:
  raise ConfigError(f"{where}: {directory} has no {name}")


def check_workdir(path: str, where: str = "--workdir") -> None:
  """`path` is a directory, or nothing on its way is a file (so it can be made one)."""
  if not path:
    raise ConfigError(f"{where}: empty; give the run's directory")
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      return
    probe = parent
  if not os.path.isdir(probe):
    inside = "" if probe == os.path.abspath(path) else f" (on the way to {path})"
    raise ConfigError(f"{where}={path}: {probe} is a file, not a directory{inside}")
