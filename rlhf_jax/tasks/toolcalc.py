"""The built-in `toolcalc` task: products a tiny model cannot work out in its head, with a
calculator it may call (rollout.mode 'multi_turn', `envs.tools.calculator_environment`).

A problem is arith's word problem for a × b with a of 3–6 digits and b of 2–3 digits
(`LEVELS`). The tool-using answer is two model turns around a tool turn, in the Hermes
form and the ChatML template:

    <tool_call>{"name":"calculator","arguments":{"expression":"4721*386"}}</tool_call><|im_end|>
    <|im_start|>tool
    1822306<|im_end|>
    <|im_start|>assistant
    Answer: 1822306<|endoftext|>

The direct answer is "Answer: N" at once. `verify` is arith's (the last "Answer:" line of
the last model turn). The warm start mixes both forms of demonstration (`sft.direct_fraction`
of them direct and right, a form the student cannot imitate); RL then learns to call the
tool, and to copy its operands and result exactly (configs/toolcalc.py).
"""

from __future__ import annotations

import json
import string
from typing import Iterator

import numpy as np

from rlhf_jax.tasks import arith

TASK = "toolcalc"
# arith's characters, then the rest of printable ASCII: the tool call's JSON and tags and
# whatever the calculator's error lines say.
ALPHABET = arith.ALPHABET + "".join(c for c in string.printable[:-5]
                                    if c not in arith.ALPHABET)
# Digits of (a, b) per difficulty level.
LEVELS = {1: (3, 2), 2: (4, 2), 3: (5, 3), 4: (6, 3)}
TURN_END = "<|im_end|>"  # `env.turn_end`: ends the tool-calling turn
verify = arith.verify


def sample_problem(rng: np.random.Generator, level: int) -> arith.Problem:
  """One a × b problem of the given level (`LEVELS`)."""
  if level not in LEVELS:
    raise ValueError(f"level={level}; allowed: {sorted(LEVELS)}.")
  digits_a, digits_b = LEVELS[level]
  a = int(rng.integers(10 ** (digits_a - 1), 10 ** digits_a))
  b = int(rng.integers(10 ** (digits_b - 1), 10 ** digits_b))
  return arith.Problem(a=a, b=b, op="*", level=level,
                       name=arith.NAMES[rng.integers(len(arith.NAMES))],
                       item=arith.ITEMS[rng.integers(len(arith.ITEMS))])


def generate(seed: int, count: int, levels: tuple[int, ...] = (1, 2),
             weights: tuple[float, ...] | None = None) -> Iterator[arith.Problem]:
  """`count` problems, deterministic in `seed`, levels drawn with `weights`."""
  rng = np.random.default_rng(seed)
  probs = None if weights is None else np.asarray(weights, float) / np.sum(weights)
  for _ in range(count):
    yield sample_problem(rng, int(rng.choice(levels, p=probs)))


def examples(seed: int, count: int, levels: tuple[int, ...] = (1, 2),
             weights: tuple[float, ...] | None = None) -> list:
  """`count` generated problems as `rlhf_jax.data.Example`s (answer: the product)."""
  from rlhf_jax.data import Example  # pylint: disable=import-outside-toplevel
  return [Example(prompt=p.prompt, answer=str(p.answer), task=TASK,
                  metadata={"a": p.a, "b": p.b, "level": p.level})
          for p in generate(seed, count, levels, weights)]


def tool_call(problem: arith.Problem) -> str:
  """The calculator call of the demonstration (compact Hermes JSON)."""
  call = {"name": "calculator", "arguments": {"expression": f"{problem.a}*{problem.b}"}}
  return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def demonstration(problem: arith.Problem, tokenizer, *, direct: bool
                  ) -> tuple[list[int], list[int]]:
  """The response tokens of a demonstration and their loss mask (1 on the model's turns,
  0 on the tool turn), exactly as a multi-turn rollout lays them out: the call and the
  turn end, the tool turn as `Tokenizer.turn_suffix` renders it, the answer and EOS.
  `direct`: the answer alone, "Answer: N" and EOS."""
  answer = tokenizer.encode(f"Answer: {problem.answer}") + [tokenizer.eos_id]
  if direct:
    return answer, [1] * len(answer)
  call = tokenizer.encode(tool_call(problem) + TURN_END)
  tool = tokenizer.encode(tokenizer.turn_suffix("tool", str(problem.answer),
                                                turn_end=TURN_END))
  return call + tool + answer, [1] * len(call) + [0] * len(tool) + [1] * len(answer)


def sft_batches(tokenizer, *, seed: int, batch_size: int, levels, weights,
                prompt_prefix, prompt_length: int, response_length: int,
                direct_fraction: float, slip_rate: float = 0.0):
  """`make_batch(step)` for run_sft: fresh problems every step, a `direct_fraction` of
  them demonstrated by the direct answer, the rest with the calculator; the loss is on
  the model's turns only. `slip_rate` (arith's careless teacher) does not apply: the
  calculator's demonstrations work out nothing by hand."""
  del slip_rate
  from rlhf_jax.batch import build_rollout_batch  # pylint: disable=import-outside-toplevel

  def make_batch(step):
    problems = list(generate(seed * 1_000_003 + step, batch_size, levels, weights))
    direct = np.random.default_rng([seed, step]).random(batch_size) < direct_fraction
    rows = [demonstration(p, tokenizer, direct=bool(d)) for p, d in zip(problems, direct)]
    prompts = [list(prompt_prefix) + tokenizer.encode(p.prompt) for p in problems]
    responses = [ids for ids, _ in rows]
    return build_rollout_batch(
        prompts, responses, [[0.0] * len(r) for r in responses], [0.0] * batch_size,
        [False] * batch_size, list(range(batch_size)), prompt_length=prompt_length,
        response_length=response_length, pad_id=tokenizer.pad_id,
        loss_masks=[mask for _, mask in rows])

  return make_batch


def tokenizer():
  """The character tokenizer of the task (`ALPHABET` plus the ChatML special tokens)."""
  from rlhf_jax import models  # pylint: disable=import-outside-toplevel
  return models.build_character_tokenizer(ALPHABET)


def check_warm_start(directory: str) -> None:
  """Raises ConfigError (naming model.checkpoint) when the warm start in `directory` cannot
  write a tool call: an arith warm start (no braces, quotes or tags) found where the
  toolcalc one belongs."""
  from rlhf_jax import models  # pylint: disable=import-outside-toplevel
  from rlhf_jax.config_errors import invalid  # pylint: disable=import-outside-toplevel
  try:
    models.Tokenizer.from_directory(directory).encode(ALPHABET)
  except Exception:  # pylint: disable=broad-except
    invalid("model.checkpoint", directory, "holds a warm start whose tokenizer cannot write "
            "toolcalc's tool calls (an arith one?); delete it to train the toolcalc warm start")


def validate_run(c, mode) -> None:
  """The settings the task's demonstrations assume: episodes with an environment (`mode`,
  the run's `rollout.modes.RolloutMode`, needs one) whose calling turn ends at
  `TURN_END`, a turn cap that fits the longest call and a row budget that fits the longest
  demonstration (of `data.levels` and `sft.levels`). Raises ConfigError naming the field."""
  from rlhf_jax.config_errors import invalid  # pylint: disable=import-outside-toplevel
  if not mode.needs_environment:
    invalid("rollout.mode", mode.name, "must be 'multi_turn' for data.task='toolcalc' "
            "(episodes with the calculator, as configs/toolcalc.py sets)")
  if c.env.turn_end != TURN_END:
    invalid("env.turn_end", c.env.turn_end, f"must be {TURN_END!r} for data.task="
            "'toolcalc' (its demonstrations end the calling turn with it)")
  levels = [level for level in (*c.data.levels, *c.sft.levels) if level in LEVELS]
  if not levels:
    return  # the levels' own check names them
  digits_a, digits_b = LEVELS[max(levels)]
  largest = arith.Problem(a=10 ** digits_a - 1, b=10 ** digits_b - 1, op="*", level=1)
  tokens = tokenizer()
  row, _ = demonstration(largest, tokens, direct=False)
  call = len(tokens.encode(tool_call(largest) + TURN_END))
  if c.rollout.max_new_tokens < call:
    invalid("rollout.max_new_tokens", c.rollout.max_new_tokens, f"must be >= {call} for "
            f"data.task='toolcalc' (the longest calculator call of level {max(levels)})")
  if c.env.max_tokens < len(row):
    invalid("env.max_tokens", c.env.max_tokens, f"must be >= {len(row)} for data.task="
            f"'toolcalc' (the longest tool-using episode of level {max(levels)})")
