"""One way to raise a config error: `invalid` and its friends, each error carrying its field.

A source scan keeps the older ways out of rlhf_jax/ and launch/ (a ValueError whose text
starts with "config." for a caller to parse back, a ConfigError written by hand without
its field, a `fail` or `reword` helper), and the errors of the modules that used them
name their field in `.field` and in the message, as `invalid` writes it:
"config.<field>: invalid value <repr(value)>: <requirement>".
"""

import ast
import pathlib

import pytest

from rlhf_jax.config_errors import INVALID_VALUE
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.config_errors import unfit
from rlhf_jax.data import Example
from rlhf_jax.data.curriculum import CurriculumStream
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards.judge import check_template
from rlhf_jax.rewards.judge import verdict_token_ids
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.search.best_of_n import BestOfNOptions
from rlhf_jax.search.qsharp import QSharpOptions
from rlhf_jax.training import config as trainer_config
from tests.training.runs import parse

# ml_collections loads preset files with the deprecated importlib load_module().
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
ROOT = pathlib.Path(__file__).resolve().parents[1]
OLDER_HELPERS = ("fail", "reword")


def older_ways(source: str) -> list[str]:
  """The older ways of raising a config error in `source`: a ValueError whose message
  starts with "config.<field>" (config.json, a checkpoint's file, is not a field) or a
  ConfigError's without `field=`, and a definition, import or call of `fail` / `reword`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
        and (node.func.id == "ValueError" or node.func.id == "ConfigError"
             and not any(keyword.arg == "field" for keyword in node.keywords))):
      first = node.args[0]
      if isinstance(first, ast.JoinedStr) and first.values:
        first = first.values[0]
      text = first.value if isinstance(first, ast.Constant) else None
      if (isinstance(text, str) and text.startswith("config.")
          and not text.startswith("config.json")):
        found.append(f"line {node.lineno}: {node.func.id}({text[:30]!r}...)")
    named = (node.name if isinstance(node, ast.FunctionDef) else
             node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             else None)
    if named in OLDER_HELPERS:
      found.append(f"line {node.lineno}: {named}")
    if isinstance(node, ast.ImportFrom) and node.module == "rlhf_jax.config_errors":
      found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                if alias.name in OLDER_HELPERS]
  return found


def test_the_scan_finds_each_older_way():
  found = older_ways('raise ValueError(f"config.{field}={value!r} must be >= 0.")\n'
                     'raise ValueError("config.x.y: is required")\n'
                     'from rlhf_jax.config_errors import reword\n'
                     'def fail(field, message):\n  pass\n'
                     'fail("x.y", "=1 must be 0")\n'
                     'raise ConfigError(f"config.{field}: {error}")\n')
  assert sorted(hit.split(":")[0] for hit in found) == [
      f"line {n}" for n in (1, 2, 3, 4, 6, 7)]
  assert older_ways('raise ValueError(f"config.json: {key}={value!r} must be > 0.")\n'
                    'raise ValueError(f"{field}={value!r} must be >= 0.")\n'
                    'raise ConfigError(f"config.x.y: {error}", field="x.y")\n'
                    'raise ConfigError(f"--flag={value}: must be >= 1")\n'
                    'invalid("x.y", 1, "must be 0")\n') == []


def test_no_older_way_is_left_in_the_library_or_the_launchers():
  found = {}
  for folder in ("rlhf_jax", "launch"):
    for path in sorted((ROOT / folder).rglob("*.py")):
      hits = older_ways(path.read_text(encoding="utf-8"))
      if hits:
        found[str(path.relative_to(ROOT))] = hits
  assert not found, f"config errors raised the older way (use invalid/unfit): {found}"


def raised(call, *args, **kwargs) -> ConfigError:
  """The ConfigError `call(*args, **kwargs)` raises."""
  with pytest.raises(ConfigError) as error:
    call(*args, **kwargs)
  return error.value


def test_unfit_names_the_field_and_what_it_does_not_fit():
  error = raised(unfit, "data.train_file", "rows.jsonl:3: no scorer for task 'proof'")
  assert (str(error), error.field, error.kind) == (
      "config.data.train_file: rows.jsonl:3: no scorer for task 'proof'", "data.train_file",
      INVALID_VALUE)


@pytest.mark.parametrize("text,requirement", [
    ("math:1@5", "every phase but the last ends with '@step', the last has none "
     "(phase 1: 'math:1@5')"),
    ("math:1@x; code:1", "step 'x' is not an integer"),
    ("math:1,math:2", "a task appears twice in phase 1"),
])
def test_curriculum_errors_carry_their_field(text, requirement):
  error = raised(parse_curriculum, text)
  assert (str(error), error.field, error.kind) == (
      f"config.data.curriculum: invalid value {text!r}: {requirement}", "data.curriculum",
      INVALID_VALUE)
  missing = raised(CurriculumStream, [Example("1+1?\n", "2", "math")],
                   parse_curriculum("code:1"))
  assert missing.field == "data.curriculum"


@pytest.mark.parametrize("section", ["sampler", "reward.judge_sampler"])
@pytest.mark.parametrize("field,value,requirement", [
    ("update_policy", "later", "is not one of finish_old, swap_now"),
    ("max_prefill_batch", 6, "must be a power of two (1, 2, 4, ...)"),
    ("prompt_buckets", (8, 64), "must be a non-empty tuple of integers in [1, "
     "cache_length=64) (room for new tokens)"),
])
def test_scheduler_option_errors_carry_their_field(section, field, value, requirement):
  config = sampler_config_lib.sampler_config(num_slots=1, cache_length=64,
                                             prompt_buckets=(8, 16))
  config[field] = value
  error = raised(sampler_config_lib.validate_sampler_config, config, section)
  assert (str(error), error.field) == (
      f"config.{section}.{field}: invalid value {value!r}: {requirement}",
      f"{section}.{field}")


class CharacterTokenizer:
  """One token per character (its code point)."""

  def encode(self, text: str) -> list[int]:
    return [ord(char) for char in text]


def test_judge_errors_carry_their_field():
  template = "{answer} {extra}"
  error = raised(check_template, template, genrm.TEMPLATE_FIELDS["gt"], ("answer",),
                 "reward.genrm.template_gt")
  assert error.field == "reward.genrm.template_gt"
  assert str(error).startswith(f"config.reward.genrm.template_gt: invalid value {template!r}: "
                               "placeholders must include ['answer']")
  assert verdict_token_ids(CharacterTokenizer(), {"a.yes": "Y", "a.no": "N"}) == (89, 78)
  long = raised(verdict_token_ids, CharacterTokenizer(), {"a.yes": "Y", "a.no": "No"})
  assert (long.field, str(long)) == ("a.no", "config.a.no: invalid value 'No': is 2 tokens "
                                     "for the judge's tokenizer; a verdict must be exactly "
                                     "one token")
  shared = raised(verdict_token_ids, CharacterTokenizer(), {"a.yes": "Y", "a.no": "Y"})
  assert shared.field == "a.no" and "shares its token with a.yes" in str(shared)


def test_a_bad_judge_template_in_a_preset_names_its_field():
  config = parse("configs/grpo.py:arith", "--config.reward.genrm.template_gt={extra}")
  error = raised(trainer_config.validate_config, config, num_devices=1)
  assert error.field == "reward.genrm.template_gt", str(error)


@pytest.mark.parametrize("options", [QSharpOptions(), BestOfNOptions()])
@pytest.mark.parametrize("field,value", [
    ("sampler.address", "localhost:1"), ("sampler.addresses", ("localhost:1", "localhost:2"))])
def test_the_searches_name_the_server_field_that_is_set(options, field, value):
  config = trainer_config.base_config("arith")
  section, name = field.split(".")
  config[section][name] = value
  error = raised(options.check, config)
  assert error.field == field
  assert str(error).startswith(f"config.{field}: invalid value {value!r}: must be empty")
