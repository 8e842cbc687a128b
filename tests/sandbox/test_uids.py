"""Sandbox uids (sandbox/uids.py): each lease holds a uid no other holder of the lock
directory has, gives it back on exit, and a lock directory that cannot be made is one
error naming it."""

from __future__ import annotations

import os

import pytest

from rlhf_jax.sandbox import uids


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
  """A lock directory of this test's own, and uids far from the sandbox's real range: a
  lease kills every process of its uid, and no process on the host runs as these."""
  directory = tmp_path / "uids"
  monkeypatch.setenv("RLHF_JAX_SANDBOX_UID_DIR", str(directory))
  monkeypatch.setattr(uids, "UID_FIRST", 3_900_000_000)
  return directory


def test_nested_leases_hold_distinct_uids_and_give_them_back(lock_dir):
  with uids.lease() as first:
    assert first == uids.UID_FIRST
    with uids.lease() as second:
      assert second == uids.UID_FIRST + 1
    with uids.lease() as again:  # the second's uid was given back
      assert again == second
  with uids.lease() as after:
    assert after == first
  assert sorted(os.listdir(lock_dir)) == [str(first), str(second)]


def test_processes_of_reads_proc_by_uid():
  assert os.getpid() in uids.processes_of(os.getuid())
  assert uids.processes_of(3_900_000_000) == []


def test_an_unusable_lock_directory_is_named(tmp_path, monkeypatch):  # before any uid is tried
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  monkeypatch.setenv("RLHF_JAX_SANDBOX_UID_DIR", str(blocker / "uids"))
  with pytest.raises(uids.NoFreeUid, match=f"cannot create the sandbox uid lock directory "
                                           f"{blocker / 'uids'}"):
    with uids.lease():
      pass
