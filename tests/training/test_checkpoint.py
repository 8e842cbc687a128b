"""A checkpoint save that fails (a full disk) is one line saying which checkpoint is
intact, with the failed save's temporary directory removed and the earlier checkpoint
restoring as it was; on a real full file system (a 3 MB tmpfs in a user and mount
namespace) and with the failure injected where Orbax raises it."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.training.checkpoint import CheckpointSaveError
from rlhf_jax.training.checkpoint import Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_failed_save_removes_its_temporary_directory_and_names_the_intact_one(tmp_path,
                                                                               monkeypatch):
  checkpointer = Checkpointer(str(tmp_path))
  state = {"w": jnp.arange(8, dtype=jnp.float32)}
  checkpointer.save(1, state, {"step": 1})

  def full_disk():  # what Orbax leaves and raises when the disk fills mid-save
    os.makedirs(os.path.join(checkpointer.directory, "2.orbax-checkpoint-tmp", "state"))
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(checkpointer.manager, "wait_until_finished", full_disk)
  with pytest.raises(CheckpointSaveError) as error:
    checkpointer.save(2, {"w": jnp.ones(8, jnp.float32)}, {"step": 2})
  directory = checkpointer.directory
  assert str(error.value) == (
      f"checkpoint {directory}/2 was not saved (no space left on device); its temporary "
      f"directory {directory}/2.orbax-checkpoint-tmp was removed; the newest intact "
      f"checkpoint is {directory}/1 (a resume continues from it)")
  monkeypatch.undo()
  assert sorted(os.listdir(directory)) == ["1"]
  restored, meta = checkpointer.restore(1, state)
  np.testing.assert_array_equal(restored["w"], np.arange(8, dtype=np.float32))
  assert meta == {"step": 1}


SAVE = textwrap.dedent("""
    import os, sys
    import jax.numpy as jnp, numpy as np
    from rlhf_jax.training.checkpoint import Checkpointer, CheckpointSaveError
    checkpointer = Checkpointer(sys.argv[1])
    checkpointer.save(1, {"w": jnp.zeros(1000, jnp.float32)}, {"step": 1})
    noise = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32)
    try:  # 16 MB that do not compress, on a 3 MB file system
      checkpointer.save(2, {"w": jnp.asarray(noise)}, {"step": 2})
    except CheckpointSaveError as error:
      print(f"error: {error}", file=sys.stderr)
    print(sorted(os.listdir(checkpointer.directory)))
    state, meta = checkpointer.restore(1, {"w": jnp.zeros(1000, jnp.float32)})
    print(meta["step"], float(state["w"].sum()))
""")


@pytest.mark.slow
def test_a_full_file_system_during_a_save_is_one_line_and_nothing_is_lost(tmp_path):
  if shutil.which("unshare") is None:
    pytest.skip("needs unshare (util-linux)")
  mount = tmp_path / "disk"
  mount.mkdir()
  (tmp_path / "save.py").write_text(SAVE)
  result = subprocess.run(
      ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
       f"mount -t tmpfs -o size=3m tmpfs {mount} && exec {sys.executable} "
       f"{tmp_path / 'save.py'} {mount / 'run'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  if "mount" in result.stderr and result.returncode and "error:" not in result.stderr:
    pytest.skip(f"no tmpfs in a user namespace here: {result.stderr[-200:]}")
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  checkpoints = mount / "run" / "checkpoints"
  assert lines == [f"error: checkpoint {checkpoints}/2 was not saved (no space left on "
                   f"device); its temporary directory {checkpoints}/2.orbax-checkpoint-tmp "
                   f"was removed; the newest intact checkpoint is {checkpoints}/1 (a resume "
                   "continues from it)"], result.stderr[-3000:]
  assert result.stdout.splitlines() == ["['1']", "1 0.0"]
