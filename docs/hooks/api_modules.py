"""mkdocs hook: expands `::: package.*` in a page into one `:::` directive per module.

The API pages name packages, not modules, so a module that is added, moved or renamed shows
up in the reference without editing the pages (listing modules by hand goes stale while the
tree is reorganised). Modules are found on disk, not imported; private modules (`_x`) and
generated protobuf modules (`*_pb2*`) are left out. A package that does not exist is an
error, so `mkdocs build --strict` fails on a page that names one.
"""

from __future__ import annotations

import pathlib
import re

_STAR = re.compile(r"^::: ([A-Za-z_][\w.]*)\.\*[ \t]*$", re.MULTILINE)
_ROOT = pathlib.Path(__file__).resolve().parents[2]


def public_modules(package: str, root: pathlib.Path = _ROOT) -> list[str]:
  """Dotted names of the public modules under `package` (recursively), sorted.

  Args:
    package: a dotted package name, e.g. "rlhf_jax.kernels".
    root: the directory that holds the top-level package.

  Returns:
    ["rlhf_jax.kernels.advantages", ...]: every `*.py` and sub-package except `__init__`,
    names starting with `_` and generated `*_pb2*` modules.

  Raises:
    ValueError: `package` is not a package directory under `root`.
  """
  directory = root.joinpath(*package.split("."))
  if not (directory / "__init__.py").is_file():
    raise ValueError(f"::: {package}.* names no package (no {directory}/__init__.py)")
  names = []
  for path in sorted(directory.iterdir()):
    name = path.stem if path.suffix == ".py" else path.name
    if name.startswith("_") or "_pb2" in name:
      continue
    if path.suffix == ".py":
      names.append(f"{package}.{name}")
    elif (path / "__init__.py").is_file():
      names.append(f"{package}.{name}")
      names.extend(public_modules(f"{package}.{name}", root))
  return names


def on_page_markdown(markdown: str, **kwargs) -> str:
  """Replaces each `::: package.*` line with a `::: module` directive per public module."""
  del kwargs
  return _STAR.sub(
      lambda m: "\n\n".join(f"::: {name}" for name in public_modules(m.group(1))), markdown)
