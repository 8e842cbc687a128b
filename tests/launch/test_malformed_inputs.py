"""The red team's malformed inputs (checkpoints, chat templates, data rows,
logs) through the launchers as a user runs them: each is one line on stderr naming the
file, exit status 2, in seconds, where they spun, aborted or gave tracebacks.

`python tests/launch/test_malformed_inputs.py [--filter=TEXT]` prints the table: every case,
its one line, the exit status and the seconds it took.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: tests.launch.* importable

from tests.launch.malformed import CASES  # noqa: E402
from tests.launch.malformed import make_malformed  # noqa: E402
from tests.launch.malformed import run_case  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("malformed")
  make_malformed(root)
  return root


QUICK = ("serve.py: config.json num_hidden_layers=10000000",
         "train.py: chat template, loops", "train.py: data row of 50 MB")


@pytest.mark.parametrize("case,launcher,arguments,names", [
    pytest.param(*c, id=c[0], marks=() if c[0] in QUICK else pytest.mark.slow) for c in CASES])
def test_a_malformed_input_is_one_line_and_exit_2(case, launcher, arguments, names, files,
                                                 tmp_path):
  del case
  result, seconds = run_case(launcher, arguments, files, tmp_path / "work", timeout=120)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
  assert names in lines[0], lines[0]
  assert seconds < 60


def main(argv: list[str]) -> None:
  import tempfile
  only = next((a.split("=", 1)[1] for a in argv if a.startswith("--filter=")), "")
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    make_malformed(root / "files")
    print("| case | stderr (its lines: the last) | exit | seconds |\n|---|---|---|---|")
    for number, (case, launcher, arguments, _) in enumerate(CASES):
      if only not in case:
        continue
      try:
        result, seconds = run_case(launcher, arguments, root / "files", root / f"w{number}",
                                   timeout=300)
      except subprocess.TimeoutExpired:
        print(f"| {case} | - | killed | > 300 |", flush=True)
        continue
      lines = [line for line in result.stderr.splitlines() if line.strip()]
      last = (lines[-1] if lines else "").replace(str(root / "files"), "…").replace("|", "\\|")
      print(f"| {case} | ({len(lines)}) {last[:160]} | {result.returncode} | {seconds:.1f} |",
            flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
