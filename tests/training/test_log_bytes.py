"""metrics.jsonl and rollouts.jsonl with bytes that are not UTF-8 (a crash that cut a
multi-byte character, a damaged disk block): handled as a torn or malformed line is, and
named by file and line, where every resume was a traceback naming neither."""

from __future__ import annotations

import json

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.metrics import truncate_jsonl


def record(step: int) -> bytes:
  return json.dumps({"step": step, "note": "caf\u00e9 \u2713"}, ensure_ascii=False).encode()


def test_a_torn_multi_byte_character_at_the_end_is_a_torn_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  torn = record(3)[:record(3).index("\u2713".encode()) + 1]  # cut inside the ✓
  path.write_bytes(record(1) + b"\n" + record(2) + b"\n" + torn)
  warnings = []
  truncate_jsonl(str(path), 5, warnings.append)
  assert path.read_bytes() == record(1) + b"\n" + record(2) + b"\n"
  assert len(warnings) == 1 and f"{path}: dropped its torn last line 3" in warnings[0]


def test_bad_bytes_before_the_last_line_name_the_file_and_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  before = record(1) + b"\n" + b"\xff\xfe garbage\n" + record(2) + b"\n"
  path.write_bytes(before)
  with pytest.raises(ConfigError, match=f"^{path}: line 2 is not a record with a step "
                                        r"\('utf-8' codec can't decode byte 0xff"):
    truncate_jsonl(str(path), 5, print)
  assert path.read_bytes() == before  # nothing rewritten
