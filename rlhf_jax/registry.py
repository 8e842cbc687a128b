"""The component table's two kinds of entry: a `Registry` of plug-ins (and the one loader of
every `module:name`), and a config `Section`.

    ESTIMATORS = Registry("estimator", "algorithm.advantage.estimator", Estimator,
                          what="Estimator or function", wrap=Estimator, check=...)
    ESTIMATORS.register("group_gap", record)       a user's name; again: replaced
    @ESTIMATORS.register("group_gap")              the decorator form
    ESTIMATORS.resolve(value, field) -> Estimator  a registered name or "module:name"

Estimators, policy losses, learners, rollout modes and tasks are `Registry`s; reward
functions and environment factories are too, named by `module:name` only (they are loaded
again in spawned worker processes, where a name registered in the parent is unknown).

One policy for a name registered again: a user's entry is replaced (a notebook cell run
again), a built-in is never replaced. One lookup, `resolve`: a registered name, or
"package.module:name" / "path/to/file.py:name" imported by `load_object` (the working
directory on the path, as `python script.py` finds modules beside the script), then a plain
function wrapped into the record by the registry's `wrap`, then the registry's `check`.
Every error is one line naming the config field (`ConfigError`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import types
from typing import Any, Callable, Generic, Iterator, NoReturn, TypeVar

from rlhf_jax.config_errors import invalid

R = TypeVar("R")
_DOCS = "docs/extending.md"


class Registry(collections.abc.Mapping, Generic[R]):
  """The records of one kind of plug-in by name (a read-only Mapping name → record, in
  registration order: built-ins first).

  Args:
    kind: what a record is, in messages ("estimator", "rollout mode").
    field: the config field that names one ("algorithm.advantage.estimator").
    record_type: the record's class; a `module:name` attribute must be one (or be a
      callable, when `wrap` is given).
    what: what a `module:name` attribute must be, in messages ("Estimator or function").
    wrap: `(name, fn) -> record`: a plain function as a record with default capabilities;
      None: only records are taken.
    check: `(record, name, field) -> None`: the registry's one check of a record (its
      function's signature), run on every registered or loaded record; raises naming
      `field`.
    by_name: False for a kind named by `module:name` only (reward functions and
      environment factories, loaded again in each worker): `register` refuses.
  """

  def __init__(self, kind: str, field: str, record_type: type, *, what: str,
               wrap: Callable[[str, Callable], R] | None = None,
               check: Callable[[R, str, str], None] | None = None, by_name: bool = True):
    self.kind, self.field, self.record_type, self.what = kind, field, record_type, what
    self._wrap, self._check, self._by_name = wrap, check, by_name
    self._records: dict[str, R] = {}
    self._built_in: set[str] = set()

  def __getitem__(self, name: str) -> R:
    if name not in self._records:
      raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self._records)}")
    return self._records[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._records)

  def __len__(self) -> int:
    return len(self._records)

  # A table is one object (module-global), equal only to itself, not a Mapping of values.
  __eq__ = object.__eq__
  __hash__ = object.__hash__

  def register(self, name: str, record: R | Callable | None = None, *, built_in: bool = False):
    """Adds `record` under `name`, so the registry's field may name it; a plain callable is
    wrapped (`wrap`). Without `record`, a decorator that registers what it decorates and
    returns it unchanged. A user's name registered again is replaced; a built-in's is a
    ValueError (`built_in`: the library's own records). Returns the stored record.

    Raises:
      ValueError: a name that is empty or holds ':' (that spells a module path), a record
        whose own `name` differs, a built-in's name, or a registry named by path only.
      TypeError: a record of the wrong type.
      ConfigError: the registry's `check` refuses the record (naming its field).
    """
    if record is None:
      def decorator(value):
        self.register(name, value, built_in=built_in)
        return value
      return decorator
    if not self._by_name:
      raise ValueError(f"a {self.kind} is named by 'package.module:name' only ({self.field}): "
                       "it is loaded again in each worker process")
    if not isinstance(name, str) or not name or ":" in name:
      raise ValueError(f"a {self.kind}'s name must be non-empty without ':' (that spells "
                       f"'package.module:name'); got {name!r}.")
    if not isinstance(record, self.record_type):
      if self._wrap is None or not callable(record):
        raise TypeError(f"a {self.kind} is a {self.record_type.__name__}, not "
                        f"{type(record).__name__}")
      record = self._wrap(name, record)
    if getattr(record, "name", name) != name:
      raise ValueError(f"a {self.kind} registered as {name!r} is named {record.name!r}")
    if name in self._built_in and self._records[name] is not record:
      raise ValueError(f"{name!r} is a built-in {self.kind}; register under another name")
    if self._check is not None:
      self._check(record, name, self.field)
    self._records[name] = record
    if built_in:
      self._built_in.add(name)
    return record

  def unregister(self, name: str) -> R:
    """Removes a user's entry and returns it (a test's own, undone); a built-in or an
    unknown name is a ValueError."""
    if name in self._built_in or name not in self._records:
      raise ValueError(f"{name!r} is not a {self.kind} of one's own; known: "
                       f"{', '.join(n for n in self._records if n not in self._built_in)}")
    return self._records.pop(name)

  def built_ins(self) -> tuple[str, ...]:
    """The library's own names, in registration order."""
    return tuple(n for n in self._records if n in self._built_in)

  def resolve(self, value: Any, field: str | None = None, *,
              error: Callable[[str], Exception] | None = None) -> R:
    """The record that `value` names in `field` (default: the registry's): a registered
    name, or "package.module:name" / "path/to/file.py:name" (a record, or a callable
    wrapped by `wrap`), loaded and checked here.

    Raises:
      ConfigError: one line naming `field`: an unknown name (with the registered names and
        the close ones), a module that does not import (where it looked), an attribute that
        is missing or not a record, or a record the check refuses. With `error`, the
        loader's reasons are `error(reason)` instead (load_object).
    """
    field = field or self.field
    if isinstance(value, str) and value in self._records:
      return self._records[value]
    if self._records and not (isinstance(value, str) and ":" in value):
      close = difflib.get_close_matches(value, list(self._records), n=3, cutoff=0.6) \
          if isinstance(value, str) else []
      hint = ("; did you mean " + " or ".join(repr(c) for c in close) + "?") if close else ""
      article = "an" if self.what[0].lower() in "aeiou" else "a"
      invalid(field, value, f"must be one of {', '.join(self._records)}, or "
              f"'package.module:name' ({article} {self.what}; {_DOCS}){hint}")
    loaded = load_object(value, field, what=self.what, error=error, accept=self._accepts)
    record = loaded if isinstance(loaded, self.record_type) else self._wrap(value, loaded)
    if self._check is not None:
      self._check(record, value, field)
    return record

  def _accepts(self, value: Any) -> bool:
    return isinstance(value, self.record_type) or (self._wrap is not None and callable(value))


@dataclasses.dataclass(frozen=True)
class Checking:
  """What a run's config is checked for (every section's `check` takes it).

  num_devices: the devices the mesh must fit (None: not known yet, mesh sizes alone).
  labelling: the run writes `data.offline_file` (launch/label_samples.py) instead of
    reading it.
  supervised: SFT on one's own data (launch/sft.py without `data.task`).
  """
  num_devices: int | None = None
  labelling: bool = False
  supervised: bool = False


@dataclasses.dataclass(frozen=True)
class Section:
  """One config section as the room that owns it declares it: its fields with their
  defaults and help, and its check. A trainer config is a tuple of these (the section
  table, training/config.py `SECTIONS`): `build_config` makes the default config from it,
  `check_config` checks it in dependency order, and scripts/config_reference.py writes
  docs/config_reference.md from it.

  Attributes:
    name: what other sections' `after` names ("sampler", "loggers").
    at: the dotted path of the ConfigDict the fields go in ("" the root, "train"). Two
      sections may fill one ConfigDict (the loggers' fields beside `train`'s own); a field
      both declare is an error.
    fields: `() -> ConfigDict` with every field and its default; the comment on (or just
      above) a field's line is its help. None: a rule over other sections' fields.
    check: `(config, checking) -> None`, raises ConfigError naming the field. None: the
      fields need no check of their own.
    after: the sections whose fields `check` reads; they are checked first, so an error
      names the field that is wrong where it is set, not one that reads it.
  """
  name: str
  at: str | None = None
  fields: Callable[[], Any] | None = None
  check: Callable[[Any, Checking], None] | None = None
  after: tuple[str, ...] = ()

  @property
  def owner(self) -> str:
    """The module that declares the section (its fields' builder, else its check)."""
    return (self.fields or self.check).__module__


def build_config(sections: tuple[Section, ...]):
  """The default ConfigDict of a section table: each section's fields at its `at`."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict()
  for section in sections:
    if section.fields is None:
      continue
    fields = section.fields()
    parent, _, leaf = section.at.rpartition(".")
    target = config
    for key in filter(None, parent.split(".")):
      target = target[key]
    if section.at and leaf not in target:
      target[leaf] = fields
      continue
    target = target[leaf] if section.at else target
    for key, value in fields.items():
      if key in target:
        raise ValueError(f"config section {section.name!r} ({section.owner}) declares "
                         f"{section.at + '.' if section.at else ''}{key}, which another "
                         "section declares already")
      target[key] = value
  return config


def check_order(sections: tuple[Section, ...]) -> list[Section]:
  """The sections in dependency order: each after every section its `after` names, else in
  table order (the first section whose dependencies are checked goes next)."""
  names = {s.name for s in sections}
  for section in sections:
    if unknown := [n for n in section.after if n not in names]:
      raise ValueError(f"config section {section.name!r} ({section.owner}) comes after "
                       f"unknown sections {unknown}; known: {', '.join(sorted(names))}")
  done: set[str] = set()
  order: list[Section] = []
  while len(order) < len(sections):
    ready = next((s for s in sections
                  if s.name not in done and all(n in done for n in s.after)), None)
    if ready is None:
      left = [s.name for s in sections if s.name not in done]
      raise ValueError(f"config sections {left} wait on each other (a cycle in `after`)")
    order.append(ready)
    done.add(ready.name)
  return order


def check_config(config, sections: tuple[Section, ...], checking: Checking) -> None:
  """Runs every section's check on `config`, in `check_order`; the first ConfigError
  raised names the field."""
  for section in check_order(sections):
    if section.check is not None:
      section.check(config, checking)


def check_call(fn: Callable, field: str, name: str, signature: str, *args: Any,
               **kwargs: Any) -> None:
  """ConfigError naming `field` and `name` unless `fn` accepts `args` and `kwargs` (a
  registry's `check` of a record's function; `signature` says in words what it must take).
  A callable whose signature cannot be inspected (a builtin) is taken on trust."""
  try:
    inspect.signature(fn).bind(*args, **kwargs)
  except TypeError as error:
    invalid(field, name, f"its function must take {signature}: {error}")
  except ValueError:  # no signature to inspect
    pass


def load_object(path: Any, field: str, *, accept: Callable[[Any], bool] = callable,
                what: str = "callable", error: Callable[[str], Exception] | None = None
                ) -> Any:
  """The attribute named by "package.module:name" or "path/to/file.py:name" of a config
  field, imported before any work: the one loader of every `module:name`. A dotted module
  is imported from the working directory too (as TRL and verl users run their scripts:
  `import_user_module`).

  Raises:
    ConfigError: naming `field`, for a malformed path, a module that does not import (with
      the directories searched when it is not found), or a missing attribute or one that
      `accept` refuses (`what` names what it must be; the module's file and its close
      names are said). With `error`, `error(<reason>)` instead (the reward functions'
      RewardFunctionError, whose caller names the field).
  """
  def refuse(reason: str) -> NoReturn:
    if error is not None:
      raise error(reason)
    invalid(field, path, reason)

  module_name, colon, attribute = (path if isinstance(path, str) else "").rpartition(":")
  if not colon or not module_name or not attribute:
    refuse(f"must be 'package.module:{what}' or 'path/to/file.py:{what}'")
  try:
    module = import_user_module(module_name)
  except Exception as failure:  # pylint: disable=broad-except  # user code: anything
    refuse(f"its module does not import: {type(failure).__name__}: {failure}")
  value = getattr(module, attribute, None)
  if value is None or not accept(value):
    where = getattr(module, "__file__", None)
    found = "" if value is None else f" (it is a {type(value).__name__})"
    fitting = [n for n in vars(module) if not n.startswith("_") and accept(vars(module)[n])]
    close = difflib.get_close_matches(attribute, fitting, n=3, cutoff=0.6)
    refuse(f"module {module_name!r} has no {what} {attribute!r}{found}"
           + (f" (looked in {_short(where)})" if where else "")
           + ("; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""))
  return value


def import_user_module(module: str) -> types.ModuleType:
  """The module of a `module:name` spec: a file ("dir/file.py", loaded from its path under
  a name of its own, once per process), or a dotted name imported as Python does and, when
  its top package is not found there, from the working directory as well (appended to
  sys.path, as `python script.py` would find it beside the script).

  Raises:
    ModuleNotFoundError: the module is not found; the message says where it looked (the
      file, or the directories searched, shortened).
    Exception: whatever the module's own code raises on import.
  """
  if module.endswith(".py"):
    path = os.path.abspath(module)
    if not os.path.isfile(path):
      raise ModuleNotFoundError(f"no file {module!r}"
                                + ("" if path == module else f" (looked for {path})"))
    name = "rlhf_jax_user_" + hashlib.sha1(path.encode()).hexdigest()[:16]
    if name not in sys.modules:
      spec = importlib.util.spec_from_file_location(name, path)
      loaded = importlib.util.module_from_spec(spec)
      sys.modules[name] = loaded
      try:
        spec.loader.exec_module(loaded)
      except BaseException:
        del sys.modules[name]  # a later load runs the file again, not half a module
        raise
    return sys.modules[name]
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as missing:
    if not _names_part_of(missing.name, module):
      raise  # a module the user's module imports is missing: its own message says which
    cwd = os.getcwd()
    if missing.name == module.split(".")[0] and cwd not in sys.path:
      sys.path.append(cwd)
      try:
        return importlib.import_module(module)
      except ModuleNotFoundError as again:
        if not _names_part_of(again.name, module):
          raise
        missing = again
    raise ModuleNotFoundError(f"no module named {missing.name!r} (searched "
                              f"{_searched(missing.name)})", name=missing.name) from None


def _names_part_of(name: str | None, module: str) -> bool:
  """Whether `name` is `module` or one of its parent packages."""
  return bool(name) and (module == name or module.startswith(name + "."))


def _searched(name: str) -> str:
  """Where Python looked for module `name`: its parent package's directories, or the
  working directory and the other sys.path entries ('' is the working directory), each
  shortened, at most 6 shown."""
  parent = name.rpartition(".")[0]
  package = sys.modules.get(parent) if parent else None
  if package is not None:
    return f"package {parent!r}: " + _listed(list(getattr(package, "__path__", ())))
  cwd = os.getcwd()
  others = [entry for entry in sys.path if entry and os.path.abspath(entry) != cwd]
  return f"the working directory {cwd} and sys.path: " + _listed(others)


def _listed(directories: list[str], most: int = 6) -> str:
  shown = ", ".join(_short(d) for d in directories[:most]) or "nothing"
  return shown + (f" and {len(directories) - most} more" if len(directories) > most else "")


def _short(path: str) -> str:
  """`path` relative to the working directory when inside it, else with ~ for $HOME."""
  cwd = os.getcwd()
  if path.startswith(cwd + os.sep):
    return os.path.relpath(path, cwd)
  home = os.path.expanduser("~")
  if home not in ("", "/") and path.startswith(home + os.sep):
    return "~" + path[len(home):]
  return path
