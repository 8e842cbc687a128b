"""The `data` config section: where prompts come from and how rows become prompts.

`data_config()` builds the section with its defaults and comments;
`validate_data_fields` checks the fields this package owns (files, the column mapping,
the row layout, the chat template, the curriculum); `SECTION` declares both for the
trainer's config. `data.task` and the levels are checked by the task table
(tasks/registry.py's section), which knows the tasks.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.data.example import ANSWER_FORMATS
from rlhf_jax.data.prompts import CHAT_TEMPLATE_MODES
from rlhf_jax.data.sources import parse_columns
from rlhf_jax.models.chat_template import check_template_kwargs
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section

# Template variables render_chat passes itself (a data.chat_template_kwargs entry would clash).
RENDERER_VARIABLES = ("messages", "add_generation_prompt", "tools", "documents")


def data_config() -> ml_collections.ConfigDict:
  """The `data` section with its defaults (task-neutral; a built-in task's run sets
  `task` and its sizes: training/overlays.py's arith overlay)."""
  d = ml_collections.ConfigDict()
  d.train_file = ""  # .jsonl/.parquet of prompts (prompt, answer, task); empty with data.task: generated.
  d.eval_file = ""  # Held-out prompts, same formats; empty with data.task: generated (other seeds).
  # Other schemas: our field = the file's dotted column, e.g. verl's Parquet layout
  # "answer=reward_model.ground_truth,task=data_source" (a chat-list prompt becomes
  # messages); "answer=" alone: rows without a reference (a reward function that needs none).
  d.columns = ""
  # The task of rows without a task column (e.g. 'math' for a GSM8K or TRL file); empty:
  # every row needs one. A task no verifier knows is scored by reward.function.
  d.default_task = ""
  # How the reference is read from the answer column: 'as_is', 'gsm8k' (the number after
  # "####" of a worked solution) or 'boxed' (the last \boxed{} of a MATH solution).
  d.answer_format = "as_is"
  # Chat-list prompts (messages) rendered with the tokenizer's chat template, as
  # transformers' apply_chat_template(..., add_generation_prompt=True): 'auto' (chat
  # lists rendered, plain strings raw, as TRL does), 'always' (a plain string is one user
  # turn), 'never' (raw text; a chat list gives its last user turn).
  d.chat_template = "auto"
  d.system_prompt = ""  # A system turn for rendered prompts that have none ("" = none).
  # Template variables for every rendered prompt, a JSON object, as transformers'
  # apply_chat_template(..., **kwargs): '{"enable_thinking": false}' (Qwen3 without its
  # thinking block). Rollouts, evaluation and SFT render with them; "" = none.
  d.chat_template_kwargs = ""
  # The most seconds the checkpoint's chat template may take to render one prompt (a
  # render takes milliseconds; its size and recursion are bounded too: models/template_bounds.py).
  d.template_timeout_s = 10.0
  # Task schedule (data/curriculum.py), e.g. "math:1,code:1@50; math:1,code:1,arith:2":
  # per phase the tasks' shares of each step's prompts; empty: the file's mix, shuffled.
  d.curriculum = ""
  # The built-in task whose problems are generated and whose warm start is trained from
  # scratch: 'arith' (worked solutions, verified by the answer line), 'pycalc' (a program
  # run in the sandbox) or 'toolcalc' (products, a calculator); empty: one's own
  # data files and model.checkpoint (the `:arith` preset sets 'arith').
  d.task = ""
  d.levels = (1, 2)  # arith difficulty levels of generated problems.
  d.level_weights = (1.0, 1.0)  # arith: sampling weight of each level.
  d.num_train = 20000  # arith: generated training prompts.
  d.num_eval = 256  # arith: generated held-out prompts (eval every eval_every steps).
  d.prompt_length = 512  # P: prompt tokens (left-padded; longer = error).
  d.shuffle = True  # Shuffle the prompts each epoch (False: file order).
  # rollout.mode 'offline' (DPO, DQO): .jsonl/.parquet of labelled samples (prompt,
  # responses, scores) or pairs (prompt, chosen, rejected); with data.task, empty = labelled
  # samples of the warm start written to <workdir>/offline.jsonl first (the same as
  # launch/label_samples.py).
  d.offline_file = ""
  d.offline_prompts = 2000  # Labelled samples: training prompts sampled ...
  d.offline_samples = 8  # ... and responses per prompt (the SFT policy's, verified).
  return d


def validate_data_fields(d) -> None:
  """`data.*` fields of this package: counts, files, columns, row layout, template."""
  at_least(d, "data", ("num_train", "num_eval", "prompt_length", "offline_prompts",
                       "offline_samples"))
  for field in ("train_file", "eval_file"):
    if d[field] and not os.path.isfile(d[field]):
      invalid(f"data.{field}", d[field], "must be an existing .jsonl/.parquet file (or empty: "
              "generated problems of data.task)")
  parse_columns(d.columns)
  one_of("data.answer_format", d.answer_format, ANSWER_FORMATS)
  one_of("data.chat_template", d.chat_template, CHAT_TEMPLATE_MODES)
  if not 0 < d.template_timeout_s <= 3600:
    invalid("data.template_timeout_s", d.template_timeout_s, "must be in (0, 3600] seconds")
  if d.system_prompt and d.chat_template == "never":
    invalid("data.system_prompt", d.system_prompt, "must be empty with data.chat_template="
            "'never' (no prompt is rendered as a chat)")
  if template_kwargs(d) and d.chat_template == "never":
    invalid("data.chat_template_kwargs", d.chat_template_kwargs, "must be empty with "
            "data.chat_template='never' (no prompt is rendered as a chat)")
  if d.default_task != d.default_task.strip() or "," in d.default_task:
    invalid("data.default_task", d.default_task, "must be one task name (no spaces or commas)")
  if d.curriculum:
    parse_curriculum(d.curriculum)


def template_kwargs(d) -> dict[str, Any]:
  """`data.chat_template_kwargs` parsed: the template variables (a JSON object of
  JSON values; {} when empty), refusing in one line naming the field text that is not a
  JSON object, a name that is not an identifier, a name the renderer sets itself
  (messages, add_generation_prompt, tools, documents) and transformers' arguments that
  are not template variables (tokenize, ...: they would do nothing)."""
  field, text = "data.chat_template_kwargs", d.chat_template_kwargs
  if not isinstance(text, str):
    invalid(field, text, "must be a JSON object as a string, e.g. '{\"enable_thinking\": false}'")
  if not text.strip():
    return {}
  try:
    value = json.loads(text)
  except (json.JSONDecodeError, RecursionError) as error:
    invalid(field, text, f"must be a JSON object, e.g. '{{\"enable_thinking\": false}}' "
            f"(not JSON: {getattr(error, 'msg', 'nested too deeply')})")
  if not isinstance(value, dict):
    invalid(field, text, "must be a JSON object of template variables, e.g. "
            "'{\"enable_thinking\": false}'")
  for name in value:
    if not name.isidentifier():
      invalid(field, text, f"variable {name!r} is not a name a template can read")
    if name in RENDERER_VARIABLES:
      invalid(field, text, f"variable {name!r} is set by the renderer itself")
  try:
    check_template_kwargs(value)
  except ValueError as error:
    invalid(field, text, str(error).rstrip("."))
  return value


def read_options(d) -> dict:
  """The keyword arguments of `sources.read_examples` that the `data` section sets."""
  return {"columns": parse_columns(d.columns), "default_task": d.default_task or None,
          "answer_format": d.answer_format}


def check_levels(prefix: str, levels, weights, *, allowed) -> None:
  """`<prefix>.levels` is a non-empty tuple of `allowed` difficulty levels and
  `<prefix>.level_weights` one number > 0 per level (the data's and the SFT warm start's)."""
  if not levels or any(level not in allowed for level in levels):
    invalid(f"{prefix}.levels", levels, "must be a non-empty tuple of arith levels, each one "
            f"of {', '.join(map(str, sorted(allowed)))}")
  if len(weights) != len(levels):
    invalid(f"{prefix}.level_weights", weights, f"must have one weight per {prefix}.levels "
            f"({len(levels)})")
  if any(isinstance(w, (bool, str)) or not isinstance(w, (int, float)) or not w > 0
         for w in weights):
    invalid(f"{prefix}.level_weights", weights, "must all be numbers > 0")


def check_data_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `data` section, its own fields (the task names and levels are the task
  table's check: tasks/registry.py)."""
  del checking
  validate_data_fields(c.data)


SECTION = Section("data", at="data", fields=data_config, check=check_data_section)
