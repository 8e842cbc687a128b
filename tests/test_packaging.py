"""The core install: what it pulls in, and that the package exports what it promises."""

import importlib.metadata as metadata
import re

from packaging.requirements import Requirement

import rlhf_jax.kernels

FORBIDDEN_IN_CORE = {"tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-intel", "torch"}
# The trainer's loggers (train.loggers) come with their extras only.
LOGGERS = {"tensorboardx", "wandb", "mlflow", "mlflow-skinny", "sqlalchemy", "alembic"}


def canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def core_closure(root: str = "rlhf-jax", extras: frozenset = frozenset()) -> dict[str, str]:
  """Installed distributions reachable from `root` with `extras` (none: the core install):
  name -> who required it."""
  seen = {canonical(root): "(root)"}
  stack = [(root, frozenset(extras))]
  while stack:
    name, extras = stack.pop()
    try:
      requirements = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
      continue  # an optional requirement that is not installed pulls nothing in
    for line in requirements:
      requirement = Requirement(line)
      environments = [{"extra": e} for e in extras] or [{"extra": ""}]
      if requirement.marker and not any(requirement.marker.evaluate(env)
                                        for env in environments):
        continue
      key = canonical(requirement.name)
      if key not in seen:
        seen[key] = name
        stack.append((requirement.name, frozenset(requirement.extras)))
  return seen


def test_core_install_pulls_neither_tensorflow_nor_torch():
  closure = core_closure()
  assert "jax" in closure and "orbax-checkpoint" in closure  # the walk does find the core
  offenders = {name: by for name, by in closure.items() if name in FORBIDDEN_IN_CORE}
  assert not offenders, f"core install pulls {offenders} (name: required by)"


def test_core_install_pulls_no_logger():
  offenders = {name: by for name, by in core_closure().items() if name in LOGGERS}
  assert not offenders, f"core install pulls {offenders} (name: required by)"
  # ... while the extras do (the walk would see a logger the core pulled in).
  assert "wandb" in core_closure(extras=frozenset({"wandb"}))
  assert {"mlflow-skinny", "sqlalchemy"} <= set(core_closure(extras=frozenset({"mlflow"})))


def test_every_exported_kernel_is_documented():
  for name in rlhf_jax.kernels.__all__:
    obj = getattr(rlhf_jax.kernels, name)
    if callable(obj):
      doc = obj.__doc__ or ""
      assert "Args:" in doc and "Returns:" in doc, f"{name} lacks Args/Returns in its docstring"
