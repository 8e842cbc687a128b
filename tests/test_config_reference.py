"""docs/config_reference.md is what scripts/config_reference.py generates from the code
now, and every field in it has a help line and an owner."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "config_reference.md"


def test_the_config_reference_is_up_to_date():
  # Its own process: tests here register extra learners and losses, which would add
  # sections to the config this process builds.
  result = subprocess.run([sys.executable, "scripts/config_reference.py", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr


def test_every_field_has_a_help_line_and_an_owner():
  rows = [line for line in PAGE.read_text(encoding="utf-8").splitlines()
          if re.match(r"\| `[a-z_]", line)]
  fields = [r for r in rows if not r.startswith("| `--")]
  assert len(fields) > 200
  missing = [r.split(" | ")[0] for r in fields
             if not r.split(" | ")[2].strip() or "rlhf_jax/" not in r.split(" | ")[3]]
  assert not missing, f"fields without a comment where they are set: {missing}"


def test_every_launcher_flag_is_listed():
  page = PAGE.read_text(encoding="utf-8")
  for launcher in sorted((ROOT / "launch").glob("*.py")):
    for name in re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", launcher.read_text(encoding="utf-8")):
      section = page.split(f"### {launcher.name}\n", 1)
      assert len(section) == 2 and f"| `--{name}` |" in section[1].split("\n### ")[0], (
          launcher.name, name)
