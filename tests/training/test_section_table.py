"""The trainer's section table (training/config.py `SECTIONS`): every field declared by one
section, and every check reading only its own section and the sections it says it reads.

The second property is what makes the check order a dependency order: it is measured by
tracing the fields each check reads on the presets' configs, not taken from the table.
"""

from __future__ import annotations

import importlib.util
import pathlib

import ml_collections
import pytest

from rlhf_jax.registry import Checking
from rlhf_jax.registry import check_order
from rlhf_jax.training import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Presets whose checks take different paths: groups, dynamic sampling, windows with a
# critic, a PRM's step rewards, offline pairs.
PRESETS = ("grpo", "dapo", "tppo", "vapo", "dpo")
# The rule that every float is finite reads every field by design (it runs first).
READS_EVERY_FIELD = ("finite",)
# The ConfigDicts two sections fill (the loggers' fields beside `train`'s, the learners'
# beside the algorithm's): reads are traced to the key one level down.
SHARED = ("train", "algorithm")


def _preset(name: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(f"preset_{name}", ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("arith")


def _declaring_section() -> dict[tuple[str, str], str]:
  """(the ConfigDict's path, key) → the name of the section that declares the key."""
  out = {}
  for section in config_lib.SECTIONS:
    if section.fields is not None:
      for key in section.fields().keys():
        out[(section.at, key)] = section.name
  return out


def _closure(name: str, table) -> set[str]:
  by_name = {s.name: s for s in table}
  seen, todo = {name}, [name]
  while todo:
    for before in by_name[todo.pop()].after:
      if before not in seen:
        seen.add(before)
        todo.append(before)
  return seen


def test_every_field_of_the_config_is_declared_by_a_section_of_the_table():
  """(build_config refuses a field two sections declare: tests/test_registry.py.)"""
  declared = _declaring_section()
  sections_at = {s.at for s in config_lib.SECTIONS if s.fields is not None}
  config = config_lib.base_config("hf")
  for key in config.keys():
    if key in SHARED:
      assert all((key, sub) in declared for sub in config[key].keys()), key
    else:
      assert ("", key) in declared or key in sections_at, key


@pytest.mark.parametrize("preset", PRESETS)
def test_each_check_reads_only_its_section_and_those_it_comes_after(preset):
  config = _preset(preset)
  config_lib.validate_config(config)  # a valid config: every check runs to its end
  declared = _declaring_section()
  by_path = {s.at: s.name for s in config_lib.SECTIONS if s.at and s.at not in SHARED}
  containers = {id(config): ""} | {id(config[at]): at for at in SHARED}
  reads: list[tuple[str, str]] = []
  get_item = ml_collections.ConfigDict.__getitem__

  def traced(self, key):
    if id(self) in containers:
      reads.append((containers[id(self)], key))
    return get_item(self, key)

  outside = {}
  ml_collections.ConfigDict.__getitem__ = traced
  try:
    for section in check_order(config_lib.SECTIONS):
      if section.check is None or section.name in READS_EVERY_FIELD:
        continue
      reads.clear()
      section.check(config, Checking())
      allowed = _closure(section.name, config_lib.SECTIONS)
      for at, key in set(reads):
        owner = declared.get((at, key))
        if at == "" and key in SHARED:  # traced one level down
          continue
        owner = owner or by_path[key]  # a section's own ConfigDict
        if owner not in allowed:
          outside.setdefault(section.name, set()).add(f"{at + '.' if at else ''}{key} "
                                                      f"({owner})")
  finally:
    ml_collections.ConfigDict.__getitem__ = get_item
  assert not outside, (f"checks read sections they do not come after: {outside}; add them "
                       "to the section's `after`")


def test_the_check_order_puts_every_section_after_those_it_reads():
  order = [s.name for s in check_order(config_lib.SECTIONS)]
  for section in config_lib.SECTIONS:
    assert all(order.index(before) < order.index(section.name) for before in section.after)


def test_an_error_names_the_field_where_it_is_set_not_one_that_reads_it():
  """An unknown rollout mode is the rollout section's error, even though the algorithm's
  rule (its response budget) and the learner's read the mode too."""
  from rlhf_jax.config_errors import ConfigError  # pylint: disable=import-outside-toplevel
  config = _preset("grpo")
  config.rollout.mode = "nope"
  config.algorithm.learner = "nope"
  with pytest.raises(ConfigError, match=r"rollout\.mode"):
    config_lib.validate_config(config)
