"""Writes docs/config_reference.md: every config field and every launcher flag, generated.

    python scripts/config_reference.py           # rewrite the page
    python scripts/config_reference.py --check   # exit 1 if the page is out of date

The fields are read from the config as the library builds it (`base_config` of each
base: the task-neutral `hf` and `arith`, the same with the built-in task's overlay), not from a list kept by hand: while the config is built, every assignment to a
ConfigDict is traced to the line that made it. That line's comment (at its end, or the
comment lines just above it) is the field's help, and its module and function are the
field's owner. The launchers' own flags are read from their `flags.DEFINE_*` calls.
tests/test_config_reference.py runs `--check`, so the page cannot fall behind the code.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import pathlib
import sys
import tokenize
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "config_reference.md"
# The task-neutral base, then the base with the built-in arith task's overlay.
BASES = ("hf", "arith")

sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import ml_collections  # noqa: E402  (after the path: the repository's modules import it)


def _caller(depth: int = 2):
  """The first frame outside ml_collections: the line that assigned the field."""
  frame = sys._getframe(depth)  # pylint: disable=protected-access
  while frame is not None and "ml_collections" in frame.f_code.co_filename:
    frame = frame.f_back
  return frame


def traced_config(base: str) -> tuple[ml_collections.ConfigDict, dict]:
  """The base config `base` ('hf' or 'arith'), and per (ConfigDict id, field) the (file, line,
  function) of each assignment, first one first."""
  from rlhf_jax.training.config import base_config  # pylint: disable=import-outside-toplevel
  sites: dict[tuple[int, str], list[tuple[str, int, str]]] = {}
  set_attribute = ml_collections.ConfigDict.__setattr__
  set_item = ml_collections.ConfigDict.__setitem__

  def record(config, name):
    frame = _caller(3)
    if frame is not None and frame.f_code.co_name == "build_config":
      # A section's field copied beside another section's (registry.build_config): the
      # line that set it in the section's own ConfigDict.
      source = frame.f_locals.get("fields")
      sites.setdefault((id(config), name), []).extend(sites.get((id(source), name), []))
    elif frame is not None:
      sites.setdefault((id(config), name), []).append(
          (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))

  def traced_setattr(self, name, value):
    record(self, name)
    set_attribute(self, name, value)

  def traced_setitem(self, name, value):
    record(self, name)
    set_item(self, name, value)

  ml_collections.ConfigDict.__setattr__ = traced_setattr
  ml_collections.ConfigDict.__setitem__ = traced_setitem
  try:
    config = base_config(base)
  finally:
    ml_collections.ConfigDict.__setattr__ = set_attribute
    ml_collections.ConfigDict.__setitem__ = set_item
  return config, sites


def _comments(path: str) -> dict[int, str]:
  """Line number → the text of the comment on that line."""
  out = {}
  source = pathlib.Path(path).read_text(encoding="utf-8")
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      out[token.start[0]] = token.string.lstrip("#").strip()
  return out


_COMMENTS: dict[str, dict[int, str]] = {}
_LINES: dict[str, list[str]] = {}


def help_at(path: str, line: int) -> str:
  """The comment at the end of `line`, else the comment lines right above it, else (a
  line of a group that one comment describes, e.g. `mesh.fsdp` under `mesh.data`) the
  help of the line above it, when that is code."""
  if path not in _COMMENTS:
    _COMMENTS[path] = _comments(path)
    _LINES[path] = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
  comments, lines = _COMMENTS[path], _LINES[path]
  if line in comments and not lines[line - 1].lstrip().startswith("#"):
    return comments[line]
  above = []
  number = line - 1
  while number in comments and lines[number - 1].lstrip().startswith("#"):
    above.insert(0, comments[number])
    number -= 1
  if above:
    return " ".join(above)
  previous = lines[line - 2].strip() if line > 1 else ""
  if previous and not previous.startswith(("#", "def ", "return", "@")):
    return help_at(path, line - 1)
  return ""


def fields(config, sites, prefix: str = "") -> dict[str, dict[str, Any]]:
  """Dotted field → {value, help, owner} for every leaf of `config`."""
  out = {}
  for name in config.keys():
    value = config[name]
    path = f"{prefix}{name}"
    if isinstance(value, ml_collections.ConfigDict):
      out.update(fields(value, sites, path + "."))
      continue
    assignments = sites.get((id(config), name), [])
    help_text, owner = "", ""
    for file, line, function in assignments:
      if not owner:
        owner = f"{os.path.relpath(file, ROOT)}:{function}"
      if not help_text:
        help_text = help_at(file, line)
    out[path] = {"value": value, "help": help_text, "owner": owner}
  return out


def _cell(text: str) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
  shown = repr(value)
  if len(shown) > 60:
    shown = shown[:57] + "..."
  return "`" + shown.replace("`", "'").replace("|", "\\|") + "`"


def launcher_flags() -> dict[str, list[tuple[str, str, str]]]:
  """Per launcher (launch/*.py), its flags as (name, default, help) from its DEFINE calls."""
  out = {}
  for path in sorted((ROOT / "launch").glob("*.py")):
    rows = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr.startswith("DEFINE_") and len(node.args) >= 2
              and isinstance(node.args[0], ast.Constant)):
        continue
      help_node = node.args[2] if len(node.args) > 2 else next(
          (k.value for k in node.keywords if k.arg == "help"), None)
      help_text = ""
      if help_node is not None:
        try:
          help_text = str(ast.literal_eval(help_node))
        except ValueError:
          help_text = ast.unparse(help_node)
      rows.append((node.args[0].value, ast.unparse(node.args[1]), " ".join(help_text.split())))
    if rows:
      out[path.name] = sorted(rows)
  return out


def section_table() -> list[str]:
  """The table the config is built and checked from (`training.config.SECTIONS`), in the
  order the checks run."""
  from rlhf_jax.registry import check_order  # pylint: disable=import-outside-toplevel
  from rlhf_jax.training.config import SECTIONS  # pylint: disable=import-outside-toplevel
  lines = [
      "## The section table",
      "",
      "Each section is declared once, by the module that owns it (a `registry.Section`:",
      "its fields' builder, its check, the sections its check reads); `base_config` builds",
      "the config from the table and `validate_config` runs the checks in this order, each",
      "after the sections it reads. A section without fields is a rule over other",
      "sections' fields.",
      "",
      "| section | fields at | declared in | check | checked after |",
      "| --- | --- | --- | --- | --- |",
  ]
  for section in check_order(SECTIONS):
    at = "—" if section.at is None else f"`{section.at or '(root)'}`"
    check = f"`{section.check.__name__}`" if section.check is not None else "—"
    after = ", ".join(section.after) if len(section.after) < 8 else "every other section"
    lines.append(f"| {section.name} | {at} | `{section.owner.replace('.', '/')}.py` | "
                 f"{check} | {after or '—'} |")
  return lines + [""]


def render() -> str:
  """The page's text."""
  per_base = {v: fields(*traced_config(v)) for v in BASES}
  names = list(dict.fromkeys(n for v in BASES for n in per_base[v]))
  sections: dict[str, list[str]] = {}
  for name in names:
    sections.setdefault(name.split(".")[0] if "." in name else "(top level)", []).append(name)
  lines = [
      "# Config reference",
      "",
      "Generated by `python scripts/config_reference.py` from the config as the library",
      "builds it (`rlhf_jax.training.config.base_config`), so it lists every field of every",
      "preset's base; `tests/test_config_reference.py` fails when it falls behind the code.",
      "A preset (`configs/*.py`) changes some of these defaults; `--config.<field>=value`",
      "sets any of them on the command line. *hf* is the task-neutral base",
      "(`configs/<preset>.py:hf`: one's checkpoint and data files); *arith* is that base with",
      "the built-in task's overlay (`:arith`: `ARITH_RUN` in training/overlays.py); where the",
      "overlay changes a default both are shown.",
      "The help is the comment beside the line that sets the field; *set in* is that",
      "module and function.",
      "",
      f"{len(names)} fields in {len(sections)} sections.",
      "",
  ]
  lines += section_table()
  for section, members in sections.items():
    lines += [f"## {section}", "", "| field | default | help | set in |",
              "| --- | --- | --- | --- |"]
    for name in members:
      rows = [per_base[v].get(name) for v in BASES]
      known = [r for r in rows if r is not None]
      values = {v: per_base[v][name]["value"] for v in BASES if name in per_base[v]}
      if len({repr(x) for x in values.values()}) == 1:
        default = _code(next(iter(values.values())))
      else:
        default = "<br>".join(f"{v}: {_code(x)}" for v, x in values.items())
      help_text = next((r["help"] for r in known if r["help"]), "")
      owner = next((r["owner"] for r in known if r["owner"]), "")
      lines.append(f"| `{name}` | {default} | {_cell(help_text)} | `{owner}` |")
    lines.append("")
  lines += [
      "## Launcher flags",
      "",
      "Flags of the launchers themselves (`launch/*.py`), beside `--config` and its",
      "`--config.<field>` overrides: where the run goes, what to read or write, what to do.",
      "",
  ]
  for launcher, rows in launcher_flags().items():
    lines += [f"### {launcher}", "", "| flag | default | help |", "| --- | --- | --- |"]
    lines += [f"| `--{n}` | `{_cell(d)}` | {_cell(h)} |" for n, d, h in rows]
    lines.append("")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true",
                      help="exit 1 if docs/config_reference.md is out of date")
  args = parser.parse_args()
  text = render()
  if args.check:
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if current != text:
      print(f"{os.path.relpath(PAGE, ROOT)} is out of date: run python "
            "scripts/config_reference.py", file=sys.stderr)
      return 1
    return 0
  PAGE.write_text(text, encoding="utf-8")
  print(f"wrote {os.path.relpath(PAGE, ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
