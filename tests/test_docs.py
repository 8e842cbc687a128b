"""The documentation: the site builds with --strict, and README.md stays a short front page."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 160
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def build_site(config: pathlib.Path, site_dir: pathlib.Path) -> subprocess.CompletedProcess:
  """`python -m mkdocs build --strict` with this interpreter, from the config's directory."""
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # material's banner is not a finding
  return subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
       "--site-dir", str(site_dir)],
      cwd=config.parent, env=env, capture_output=True, text=True, timeout=300, check=False)


def relative_links(markdown: str) -> list[str]:
  """Link targets in `markdown` that point into the repository (no scheme, no bare anchor)."""
  targets = [m.group(1) for m in LINK.finditer(markdown)]
  return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def heading_anchors(markdown: str) -> set[str]:
  """The ids mkdocs' `toc` extension gives the headings of `markdown` (its default slugify)."""
  anchors = set()
  in_code = False
  for line in markdown.splitlines():
    if line.startswith("```"):
      in_code = not in_code
    elif not in_code and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
      text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", m.group(1)))
      text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
      anchors.add(re.sub(r"[-\s]+", "-", text))
  return anchors


def broken_links(markdown: str, base: pathlib.Path) -> list[str]:
  """Relative links of `markdown` (a file in `base`) whose file or #anchor does not exist."""
  broken = []
  for target in relative_links(markdown):
    path, _, anchor = target.partition("#")
    file = (base / path).resolve()
    if not file.is_file():
      broken.append(f"{target} (no file {file})")
    elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text("utf-8")):
      broken.append(f"{target} (no heading #{anchor} in {path})")
  return broken


def test_site_builds_strict(tmp_path):
  result = build_site(ROOT / "mkdocs.yml", tmp_path / "site")
  assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
  for page in ("index.html", "getting_started.html", "api/kernels.html", "sandbox.html"):
    assert (tmp_path / "site" / page).is_file(), page
  # The reference is generated from docstrings, not empty pages: a known kernel is in it.
  api = (tmp_path / "site" / "api" / "kernels.html").read_text("utf-8")
  assert 'id="rlhf_jax.kernels.advantages.gae"' in api


def test_strict_build_fails_on_a_broken_link(tmp_path):
  """The check above can fail: --strict turns a link to a missing page into an error."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
  (tmp_path / "mkdocs.yml").write_text(textwrap.dedent("""\
      site_name: probe
      nav:
        - Home: index.md
  """))
  result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
  assert result.returncode != 0
  assert "missing.md" in result.stdout + result.stderr


def test_readme_is_a_short_front_page():
  lines = (ROOT / "README.md").read_text("utf-8").splitlines()
  assert len(lines) <= README_MAX_LINES, (
      f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move manual content "
      "into docs/")
  readme = "\n".join(lines)
  assert "bash scripts/test.sh" in readme and "bash scripts/demo.sh" in readme


def test_readme_links_resolve():
  readme = (ROOT / "README.md").read_text("utf-8")
  assert relative_links(readme), "the front page links onward into docs/"
  assert broken_links(readme, ROOT) == []


def test_link_checker_reports_missing_files_and_anchors(tmp_path):
  (tmp_path / "page.md").write_text("# Title\n\n## The demo `run`\n\n```\n# not a heading\n```\n")
  markdown = ("[ok](page.md) [ok anchor](page.md#the-demo-run) [web](https://example.com) "
              "[local](#x) ![img](gone.png) [bad anchor](page.md#not-a-heading) "
              "[missing](nowhere.md)")
  assert relative_links(markdown) == [
      "page.md", "page.md#the-demo-run", "gone.png", "page.md#not-a-heading", "nowhere.md"]
  broken = broken_links(markdown, tmp_path)
  assert [b.split(" ")[0] for b in broken] == ["gone.png", "page.md#not-a-heading", "nowhere.md"]


def test_api_hook_lists_public_modules(tmp_path):
  sys.path.insert(0, str(ROOT / "docs" / "hooks"))
  try:
    import api_modules  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  package = tmp_path / "pkg"
  for name in ("__init__.py", "b.py", "a.py", "_private.py", "x_pb2.py", "x_pb2_grpc.py",
               "sub/__init__.py", "sub/c.py", "notes/readme.py"):
    (package / name).parent.mkdir(parents=True, exist_ok=True)
    (package / name).write_text('"""doc"""\n')
  assert api_modules.public_modules("pkg", root=tmp_path) == [
      "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"]
  try:
    api_modules.public_modules("pkg.absent", root=tmp_path)
  except ValueError as error:
    assert "pkg.absent" in str(error)
  else:
    raise AssertionError("a missing package must be an error")
