"""The tiny arith policy the search launchers start from: one SFT run (launch/sft.py) per
test session, shared by tests/search/test_best_of_n.py and test_qsharp.py."""

from __future__ import annotations

import json

import pytest

from tests.launch.runs import SMALL
from tests.launch.runs import run


@pytest.fixture(scope="session")
def policy_workdir(tmp_path_factory):
  """A workdir holding a warm-started arith policy (the ppo preset's SFT), made once."""
  workdir = tmp_path_factory.mktemp("search")
  result = run("sft.py", "--config=configs/ppo.py:arith", f"--workdir={workdir}", *SMALL)
  assert result.returncode == 0, result.stderr[-3000:]
  json.loads(result.stdout.strip().splitlines()[-1])
  return workdir
