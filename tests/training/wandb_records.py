"""Reading what W&B wrote offline in tests (no server): the records of a run-<id>.wandb file.

The file is a LevelDB-style log (W&B's own header, 32 KiB blocks, records split across
blocks as FULL / FIRST / MIDDLE / LAST chunks) of `wandb_internal_pb2.Record` messages.
"""

import json
import struct
import time

_BLOCK = 32768
_HEADER = 7  # a chunk's crc32 (4), length (2), type (1); also the file's ":W&B", magic, version
_FULL, _LAST = 1, 4


def offline_env(monkeypatch, directory) -> None:
  """W&B offline, its caches and settings under `directory`, no console capture (also for
  subprocesses: they inherit the environment)."""
  for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                      ("WANDB_CONSOLE", "off"), ("WANDB_DIR", directory / "wandb_dir"),
                      ("WANDB_CACHE_DIR", directory / "wandb_cache"),
                      ("WANDB_DATA_DIR", directory / "wandb_data"),
                      ("WANDB_CONFIG_DIR", directory / "wandb_config")):
    monkeypatch.setenv(name, str(value))


def read_records(path):
  """The `Record` messages of a .wandb file, in order."""
  from wandb.proto import wandb_internal_pb2

  data = path.read_bytes()
  ident, magic, _ = struct.unpack("<4sHB", data[:_HEADER])
  assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic)
  offset, pending, out = _HEADER, b"", []
  while offset + _HEADER <= len(data):
    left = _BLOCK - offset % _BLOCK
    if left < _HEADER:  # a block's tail too short for a chunk header is padding
      offset += left
      continue
    _, length, kind = struct.unpack("<IHB", data[offset:offset + _HEADER])
    if kind == 0:  # zero padding at the end of a block
      offset += left
      continue
    if offset + _HEADER + length > len(data):  # a chunk still being written
      break
    pending += data[offset + _HEADER:offset + _HEADER + length]
    offset += _HEADER + length
    if kind in (_FULL, _LAST):
      out.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b""
  return out


def _items(items) -> dict:
  """Record items as name → value; a nested value (a table's reference) as a dict."""
  out = {}
  for item in items:
    *parents, name = [item.key] if item.key else item.nested_key
    node = out
    for parent in parents:
      node = node.setdefault(parent, {})
    node[name] = json.loads(item.value_json)
  return out


def finished_records(path, timeout_s: float = 30.0):
  """The records of a finished run's .wandb file: W&B's service writes it on after
  `run.finish()` returns, so this waits (up to `timeout_s`) for the exit record."""
  deadline = time.monotonic() + timeout_s
  while True:
    records = read_records(path)
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      return records
    if time.monotonic() > deadline:
      return records
    time.sleep(0.1)


def read_run(run_dir):
  """One offline run directory (wandb/offline-run-<time>-<id>) as a dict: id, name,
  project, config (name → value), history (step → {name: value}, W&B's own `_` keys left
  out), exit_code (None if the run did not finish) and tables (file name → its JSON)."""
  (path,) = run_dir.glob("run-*.wandb")
  out = {"config": {}, "history": {}, "exit_code": None, "tables": {}}
  for record in finished_records(path):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      out.update(id=record.run.run_id, name=record.run.display_name,
                 project=record.run.project)
      out["config"].update(_items(record.run.config.update))
    elif kind == "history":
      row = _items(record.history.item)
      out["history"][row["_step"]] = {k: v for k, v in row.items() if not k.startswith("_")}
    elif kind == "exit":
      out["exit_code"] = record.exit.exit_code
  for table in run_dir.glob("files/media/table/*.table.json"):
    out["tables"][table.name] = json.loads(table.read_text())
  out["config"].pop("_wandb", None)
  return out


def read_runs(workdir):
  """Every offline run under <workdir>/wandb, oldest first (a resumed run adds one)."""
  return [read_run(d) for d in sorted((workdir / "wandb").glob("offline-run-*"))]
