"""Prose a clone can follow: every repository path cited in code and docs exists, and
nothing cites a file outside the repository or an issue number.

What counts as a cited repository path (scanned in rlhf_jax/, launch/, configs/,
benchmarks/, scripts/, colabs/, tests/, docs/ and README.md):

- a token that starts at a word boundary with one of the repository's top-level folders
  (`rlhf_jax/`, `tests/`, `docs/`, `launch/`, `configs/`, `scripts/`, `benchmarks/`,
  `colabs/`) and ends in a file name with an extension (`.py`, `.md`, `.sh`, ...), or in
  `/` for a folder; it names that path from the repository root;
- a bare `<room>/<...>.py`, whose first part is a package of rlhf_jax (`rewards/prm.py`,
  `training/config.py`): it names that file under `rlhf_jax/`.

A token preceded by `/`, `.`, `:` or a word character is part of something else (an
absolute path, another project's file such as verl's `verl/docs/...`, a URL) and is not a
citation. Tokens with a placeholder (`<name>`, `*`, `...`, an f-string's `{preset}`) are
patterns, not paths, and `{a,b}` is expanded as a shell would. What follows the file name
(`:hf`, `:12`, `::test_x`, `#anchor`) is not part of the path, but a docs page's anchor
(`docs/formulas.md#dapo`) must be one of that page's headings. The few names chosen to be
absent (`EXAMPLES`: a missing config in an error test, the reader's own preset in a guide)
are listed below.

Issue numbers (`issue 35`, `#35`) say which request asked for a change, not what the
thing is; they belong in commits, never in code, tests or docs.
"""

from __future__ import annotations

import functools
import itertools
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("rlhf_jax", "launch", "configs", "benchmarks", "scripts", "colabs", "tests",
           "docs", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".ipynb", ".yml", ".yaml", ".toml", ".cfg", ".txt"}
TOP_FOLDERS = ("rlhf_jax", "tests", "docs", "launch", "configs", "scripts", "benchmarks",
               "colabs")
ROOMS = tuple(sorted(p.name for p in (REPO / "rlhf_jax").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists()))
# Not preceded by a path or word character: `/shared/run`, `verl/docs/x.md` and
# `https://...` are not ours.
_START = r"(?<![\w/.:\-])"
_PART = r"[\w.{},\-]+"
ROOTED = re.compile(_START + r"((?:" + "|".join(TOP_FOLDERS) + r")/(?:" + _PART + r"/)*"
                    + r"(?:" + _PART + r")?)")
BARE = re.compile(_START + r"((?:" + "|".join(ROOMS) + r")/(?:" + _PART + r"/)*"
                  + _PART + r"\.py)\b")
OUTSIDE = re.compile(r"ALGORITHMS\.md|DESIGN\.md")
ANCHOR = re.compile(_START + r"(docs/[\w/\-]+\.md)#([\w\-]+)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*(?:\{#([\w\-]+)\})?\s*$")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/#\-\[])#\d+(?![\w-])")
# Names that stand for a file that is not there on purpose.
EXAMPLES = {"configs/nope.py",  # tests/launch: the error a missing config file gives
            "configs/my_preset.py"}  # docs/extending.md: the reader's own preset


def scanned_files() -> list[pathlib.Path]:
  """The text files whose prose is checked (generated protobuf code and caches excluded)."""
  out = []
  for name in SCANNED:
    path = REPO / name
    if path.is_file():
      out.append(path)
      continue
    for file in sorted(path.rglob("*")):
      if (file.is_file() and file.suffix in SUFFIXES | {".proto"}
          and "__pycache__" not in file.parts and "protos" not in file.parts):
        out.append(file)
  return out


def expand(token: str) -> list[str]:
  """`a/{b,c}.py` → [`a/b.py`, `a/c.py`], as a shell expands braces (one level); a token
  with an f-string placeholder (`{preset}`, no comma) is a pattern: none."""
  if re.search(r"\{[^{},]*\}", token):
    return []
  pieces = re.split(r"\{([^{}]*)\}", token)
  choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(pieces)]
  return ["".join(c) for c in itertools.product(*choices)]


def cited_paths(line: str) -> list[tuple[str, pathlib.Path]]:
  """(the token as written, the repository path it names) for each citation in `line`."""
  out = []
  for match in ROOTED.finditer(line):
    token = match.group(1).rstrip(".,")
    if "..." in token or not (token.endswith("/") or pathlib.Path(token).suffix in SUFFIXES):
      continue
    out += [(token, REPO / t) for t in expand(token)]
  for match in BARE.finditer(line):
    token = match.group(1)
    if "..." not in token:
      out += [(token, REPO / "rlhf_jax" / t) for t in expand(token)]
  return out


def placeholder(line: str, match_end: int) -> bool:
  """Whether the token ending at `match_end` continues as a pattern (`<name>`, `*`)."""
  return line[match_end:match_end + 1] in ("<", "*")


@functools.lru_cache(maxsize=None)
def findings() -> dict[str, list[str]]:
  """Missing paths, citations outside the repository and issue numbers, as `file:line: ...`."""
  missing, outside, issues = [], [], []
  this = pathlib.Path(__file__).resolve()
  for file in scanned_files():
    where = file.relative_to(REPO)
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
      for token, path in ([] if file == this else cited_paths(line)):
        end = line.find(token) + len(token)
        if token not in EXAMPLES and not placeholder(line, end) and not path.exists():
          missing.append(f"{where}:{number}: {token}")
      if file == this:
        continue  # this file names the patterns it forbids
      if OUTSIDE.search(line):
        outside.append(f"{where}:{number}: {line.strip()}")
      if ISSUE.search(line):
        issues.append(f"{where}:{number}: {line.strip()}")
  return {"missing": missing, "outside": outside, "issues": issues}



def page_anchors(page: pathlib.Path) -> set[str]:
  """The anchors mkdocs gives `page`'s headings: an explicit `{#id}`, else the toc's slug."""
  from markdown.extensions.toc import slugify  # mkdocs' own markdown: the docs extra
  anchors, fenced = set(), False
  for line in page.read_text(encoding="utf-8").splitlines():
    if line.lstrip().startswith("```"):
      fenced = not fenced
    match = None if fenced else HEADING.match(line)
    if match:
      anchors.add(match.group(2) or slugify(match.group(1), "-"))
  return anchors


def test_cited_docs_anchors_exist():
  """`docs/<page>.md#<anchor>` in code and docs names a heading of that page."""
  pytest.importorskip("markdown")
  anchors, missing = {}, []
  this = pathlib.Path(__file__).resolve()
  for file in scanned_files():
    if file == this:
      continue
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
      for match in ANCHOR.finditer(line):
        page = REPO / match.group(1)
        if page.exists():
          known = anchors.setdefault(page, page_anchors(page))
          if match.group(2) not in known:
            missing.append(f"{file.relative_to(REPO)}:{number}: {match.group(0)}")
  assert not missing, "anchors that no heading has:\n" + "\n".join(missing)


def test_every_cited_repository_path_exists():
  """A path cited in code or docs names a file or folder of this repository."""
  missing = findings()["missing"]
  assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_nothing_cites_a_file_outside_the_repository():
  """The formulas and the architecture are in docs/, not in notes beside the clone."""
  assert not findings()["outside"], ("cites a file outside the repository (formulas: "
                                "docs/formulas.md; architecture: docs/concepts.md):\n"
                                + "\n".join(findings()["outside"]))


def test_no_issue_numbers():
  """Code, tests and docs say what a thing is, not which issue asked for it."""
  assert not findings()["issues"], "issue numbers:\n" + "\n".join(findings()["issues"])


def test_the_scanner_finds_what_it_should():
  """The rules above on made-up lines: rooted and bare paths, patterns, others' files."""
  def tokens(line):
    return [str(path.relative_to(REPO)) for _, path in cited_paths(line)]
  assert tokens("see rlhf_jax/kernels/gae.py:12 and docs/x.md#a") == [
      "rlhf_jax/kernels/gae.py", "docs/x.md"]
  assert tokens("`configs/grpo.py:hf`, tests/kernels/") == ["configs/grpo.py", "tests/kernels"]
  assert tokens("(rewards/prm.py) and training/config.py.") == [
      "rlhf_jax/rewards/prm.py", "rlhf_jax/training/config.py"]
  assert tokens("verl/docs/algo/grpo.md, /tmp/tests/a.py, https://x.org/docs/a.md") == []
  assert tokens("rlhf_jax/algorithms/{ppo,dpo}_learner.py") == [
      "rlhf_jax/algorithms/ppo_learner.py", "rlhf_jax/algorithms/dpo_learner.py"]
  assert ISSUE.search("asked for in issue 35") and ISSUE.search("see #42 ")
  assert not ISSUE.search("&#123; and url/#12 and [text](#6-a-heading) and [-#0 +]")
  assert tokens("f'configs/{preset}.py'") == []
