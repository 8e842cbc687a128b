"""Checks of a checkpoint directory a launcher or config names, before any work: each raises
a one-line `ConfigError` naming the flag or config field, the file and what is wrong with
it, which `rlhf_jax.cli.run` prints as `error: ...` with exit status 2. An error about a
config field carries it in `.field` (`field_of`).

`check_checkpoint_dir`: an HF checkpoint directory whose config.json is a JSON object
within sane bounds (`models.hf.config.check_hf_bounds`: finite numbers, sizes no published
model exceeds), whose safetensors files have a readable header of known dtypes and
non-negative shapes whose byte ranges tile the file exactly (a truncated download, a forged
header), whose shard index names existing shards, whose tensors' shapes fit config.json
(`models.hf.tensors.check_header_shapes`), and, for a policy, whose tokenizer.json is
there, is JSON and has no more token ids than the embedding has rows. Only config.json, the
index, tokenizer.json and each file's 8-byte length and JSON header are read: nothing is
built or allocated.

The other files a launcher is given are checked by their users: the config file by
`rlhf_jax.cli` (`check_config_file`), the workdir by `training.run_control.check_workdir`,
data files by their readers (data/sources.py), whose errors name the file and line.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
import subprocess
import sys
from typing import NoReturn

from rlhf_jax.config_errors import INVALID_VALUE
from rlhf_jax.config_errors import ConfigError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header (100 MB)
# Bits per element of each safetensors dtype (safetensors 0.6's list; F4/F6 are packed).
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
                    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
                    "F32": 32, "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6,
                    "F6_E3M2": 6}


def field_of(where: str) -> str | None:
  """The config field that `where` names ("config.model.checkpoint", also with a note
  after it: "config.model.checkpoint (<workdir>/sft)" → "model.checkpoint"); None for a
  launcher flag ("--checkpoint=DIR"), which is no config field."""
  if not where.startswith("config."):
    return None
  return where[len("config."):].split(" ", 1)[0]


def _refusal(where: str, detail: str) -> ConfigError:
  """The ConfigError `<where>: <detail>`, carrying the field `where` names (`field_of`)."""
  return ConfigError(f"{where}: {detail}", field=field_of(where), kind=INVALID_VALUE)


def _json_object(path: str, where: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, UnicodeDecodeError) as error:
    raise _refusal(where, f"{path} cannot be read ({error})") from None
  except RecursionError:
    raise _refusal(where, f"{path}: JSON nested too deeply to read") from None
  except json.JSONDecodeError as error:
    raise _refusal(where, f"{path}:{error.lineno}: not JSON ({error.msg})") from None
  if not isinstance(value, dict):
    raise _refusal(where, f"{path} is not a JSON object")
  return value


def check_safetensors(path: str, where: str) -> set[str]:
  """The tensor names of a sound safetensors file (`safetensors_shapes`)."""
  return set(safetensors_shapes(path, where))


def safetensors_shapes(path: str, where: str) -> dict[str, tuple[int, ...]]:
  """Tensor name → shape of a safetensors file whose 8-byte header length, JSON header
  and size agree: every tensor of a known dtype (`SAFETENSORS_BITS`), a shape of
  non-negative integers, and byte ranges [begin, end) that hold exactly its elements
  and tile the data from 0 to the file's end without gap or overlap (what the safetensors
  library checks when it opens the file, here before anything reads it). ConfigError
  naming `where`, the file and the tensor otherwise. Reads only the header."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if not 0 < length <= min(_MAX_HEADER, size - 8):
      raise _refusal(where, f"{path}: not a safetensors file, or truncated (a "
                            f"{size}-byte file whose header length reads {length})")
    try:
      header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
      header = None
  if not isinstance(header, dict):
    raise _refusal(where, f"{path}: the safetensors header is not a JSON object")
  tensors = {k: v for k, v in header.items() if k != "__metadata__"}
  spans, shapes = [], {}
  for name, entry in tensors.items():
    begin, end, shape = _tensor_span(entry)
    if begin is None:
      raise _refusal(where, f"{path}: tensor {name!r} of the safetensors header has no "
                            "sound dtype, shape and data_offsets")
    if entry["dtype"] not in SAFETENSORS_BITS:
      raise _refusal(where, f"{path}: tensor {name!r} has dtype {entry['dtype']!r}; "
                            f"known: {', '.join(SAFETENSORS_BITS)}")
    bits = math.prod(shape) * SAFETENSORS_BITS[entry["dtype"]]
    if bits != 8 * (end - begin):
      raise _refusal(where, f"{path}: tensor {name!r} of shape {list(shape)} "
                            f"({entry['dtype']}) needs {bits // 8} bytes; its data_offsets "
                            f"give {end - begin}")
    spans.append((begin, end, name))
    shapes[name] = shape
  position = 0
  for begin, end, name in sorted(spans):
    if begin != position:
      raise _refusal(where, f"{path}: tensor {name!r} starts at byte {begin} of the "
                            f"data, not {position} (its data_offsets overlap another's or leave "
                            "a gap)")
    position = end
  if 8 + length + position != size:
    raise _refusal(where, f"{path}: truncated or padded: the header gives "
                          f"{8 + length + position} bytes, the file has {size}")
  return shapes


def _tensor_span(entry) -> tuple[int | None, int, tuple[int, ...]]:
  """(begin, end, shape) of a header entry, or (None, 0, ()) when any is malformed."""
  def natural(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
  try:
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    entry["dtype"].upper()
  except (TypeError, KeyError, ValueError, AttributeError):
    return None, 0, ()
  if not (natural(begin) and natural(end) and begin <= end and all(map(natural, shape))):
    return None, 0, ()
  return begin, end, shape


def check_checkpoint_dir(directory: str, where: str, *, tokenizer: bool = True,
                         weights: bool = True) -> None:
  """An HF checkpoint directory that loads (module docstring); `where` names the flag or
  field in the error ("--checkpoint=DIR", "config.model.checkpoint"). `tokenizer`: a
  policy's directory also holds tokenizer.json; `weights`: and its safetensors (not for a
  model served elsewhere, whose config and tokenizer alone are read here)."""
  if not os.path.isdir(directory):
    what = "not a directory" if os.path.exists(directory) else "no such directory"
    raise _refusal(where, f"{directory}: {what}")
  if not os.path.exists(os.path.join(directory, "config.json")):
    _missing(directory, "config.json", where)
  config = _json_object(os.path.join(directory, "config.json"), where)
  shapes = _check_weights(directory, where) if weights else {}
  _check_model(directory, config, shapes, where)
  if tokenizer:
    path = os.path.join(directory, TOKENIZER)
    if not os.path.exists(path):
      _missing(directory, f"{TOKENIZER} (its tokenizer)", where)
    rows = shapes.get("model.embed_tokens.weight", (config.get("vocab_size"),))[0]
    tokenizer_json = _json_object(path, where)
    ids = _token_ids(tokenizer_json)
    if isinstance(rows, int) and ids > rows:
      raise _refusal(where, f"{path} has {ids} token ids, more than the {rows} rows of "
                            "the model's embedding (config.json vocab_size): its tokens past "
                            f"{rows - 1} have no embedding")
    check_tokenizer_regexes(path, tokenizer_json, where)


def _check_model(directory: str, config: dict, shapes: dict[str, tuple[int, ...]],
                 where: str) -> None:
  """config.json within bounds and, with `shapes` (the safetensors headers'), the tensors
  fitting it; a family we do not load is left to the family check, which names it."""
  from rlhf_jax.models.hf import config as hf_config  # pylint: disable=import-outside-toplevel
  from rlhf_jax.models.hf import tensors as hf_tensors  # pylint: disable=import-outside-toplevel
  try:
    hf_config.architecture_from_hf(config)
  except ValueError:
    return
  try:
    model = hf_config.config_from_hf(config)  # check_hf_bounds first
    if shapes:
      hf_tensors.check_header_shapes(model, shapes)
  except KeyError as error:
    raise _refusal(where, f"{directory}: config.json has no {error}") from None
  except (ValueError, TypeError) as error:
    raise _refusal(where, f"{directory}: {error}") from None


def _token_ids(tokenizer: dict) -> int:
  """How many token ids a tokenizer.json gives: one past the largest id of its model's
  vocabulary (a dict of ids, or Unigram's list) and of its added tokens (0 if none)."""
  model = tokenizer.get("model")
  vocab = model.get("vocab") if isinstance(model, dict) else None
  ids = [-1]
  if isinstance(vocab, dict):
    ids += [i for i in vocab.values() if isinstance(i, int)]
  elif isinstance(vocab, list):
    ids.append(len(vocab) - 1)
  ids += [t.get("id") for t in tokenizer.get("added_tokens") or ()
          if isinstance(t, dict) and isinstance(t.get("id"), int)]
  return max(ids) + 1


# The pre-tokenizer regexes of the tokenizers in common use (GPT-2's; Llama 3's and Qwen2's;
# this library's character and BPE tokenizers): known to finish, so not probed.
KNOWN_REGEXES = frozenset((
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"[\s\S]", r"\p{N}| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+"))
REGEX_PROBE_S = 5.0  # the probe's deadline; a sound regex takes milliseconds
# Each probe: runs of one character class, then a character that ends no match (where a
# nested quantifier backtracks exponentially), as Oniguruma (the tokenizers' engine) runs them.
_PROBE = """
import json, sys
from tokenizers import Regex, pre_tokenizers
texts = [c * 2000 + e for c in ("a", "A", "1", " ", "\\n", "\\t", "!", "_", "\u00e9", "a1", "a ")
         for e in ("", "!", "\\x00", " a")]
for pattern in json.loads(sys.argv[1]):
  split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
  for text in texts:
    try:
      split.pre_tokenize_str(text)
    except BaseException as error:  # Oniguruma's retry limit is a Rust panic
      print(json.dumps([pattern, text[:12] + "...", str(error).splitlines()[0][:120]]))
      sys.exit(3)
"""


def _regexes(value) -> list[str]:
  """The regex patterns of a tokenizer.json section ({"pattern": {"Regex": ...}}), nested
  pre-tokenizer and normalizer sequences included."""
  found = []
  if isinstance(value, dict):
    pattern = value.get("pattern")
    if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
      found.append(pattern["Regex"])
    for item in value.values():
      found += _regexes(item)
  elif isinstance(value, list):
    for item in value:
      found += _regexes(item)
  return found


def check_tokenizer_regexes(path: str, tokenizer: dict, where: str) -> None:
  """The regexes of a tokenizer.json's pre-tokenizer and normalizer (other than
  KNOWN_REGEXES) finish on adversarial probes: run in a child process killed after
  REGEX_PROBE_S, since a backtracking regex holds the GIL inside the tokenizers library
  and cannot be stopped in-process (and Oniguruma's retry limit panics, printing a Rust
  backtrace). ConfigError naming the file and the pattern otherwise."""
  patterns = sorted(set(_regexes(tokenizer.get("pre_tokenizer")) +
                        _regexes(tokenizer.get("normalizer"))) - KNOWN_REGEXES)
  if patterns:
    _probe_regexes(path, tuple(patterns), where)


@functools.lru_cache(maxsize=64)
def _probe_regexes(path: str, patterns: tuple[str, ...], where: str) -> None:
  try:
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(patterns)],
                            capture_output=True, text=True, timeout=REGEX_PROBE_S,
                            env={**os.environ, "RUST_BACKTRACE": "0"})
  except subprocess.TimeoutExpired:
    shown = f"{path}: a pre-tokenizer regex of {patterns!r}"[:300 - len(where) - 2]
    raise _refusal(where, shown + f" did not finish on 2000-character probes in "
                   f"{REGEX_PROBE_S:g} s (it backtracks without end)") from None
  if result.returncode == 3:
    pattern, text, error = json.loads(result.stdout.splitlines()[-1])
    raise _refusal(where, f"{path}: the pre-tokenizer regex {pattern!r} fails on "
                          f"{text!r} ({error})")
  if result.returncode:
    raise _refusal(where, f"{path}: the pre-tokenizer regexes do not compile or run "
                          f"({(result.stderr.strip().splitlines() or ['?'])[-1][:200]})")


def _check_weights(directory: str, where: str) -> dict[str, tuple[int, ...]]:
  """model.safetensors, or the shard index and every shard it names, with sound headers;
  tensor name → shape over all of them."""
  index = os.path.join(directory, SAFETENSORS_INDEX)
  shapes = {}
  if os.path.exists(index):
    weight_map = _json_object(index, where).get("weight_map")
    if not isinstance(weight_map, dict):
      raise _refusal(where, f"{index} has no weight_map object")
    for shard in sorted(set(weight_map.values())):
      path = os.path.join(directory, str(shard))
      if not os.path.isfile(path):
        raise _refusal(where, f"shard {path}, named in {SAFETENSORS_INDEX}, is missing")
      shapes.update(safetensors_shapes(path, where))
  elif os.path.exists(os.path.join(directory, SAFETENSORS)):
    shapes = safetensors_shapes(os.path.join(directory, SAFETENSORS), where)
  else:
    _missing(directory, f"{SAFETENSORS} (or {SAFETENSORS_INDEX})", where)
  return shapes


def _missing(directory: str, name: str, where: str) -> NoReturn:
  raise _refusal(where, f"{directory} has no {name}")
