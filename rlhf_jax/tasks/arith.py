"""The built-in `arith` task: arithmetic word problems a tiny model can learn on a CPU.

A problem is a short sentence around two numbers and one of +, −, ×; the
solution works digit by digit from the least significant end, one line per
digit with its carry (or borrow), so every token is computable from a few
earlier ones, then ends with a final answer line:

    Ann has 47 pens and gets 385 more. How many now?
    7+5+0=2 c1
    4+8+1=3 c1
    0+3+1=4 c0
    Answer: 432

(A probe found that a tiny model learns digit-serial formats in minutes and
left-to-right answers hardly at all: docs/algorithms.md#the-built-in-tasks.)
Difficulty levels set the operand sizes; × always
has a one-digit multiplier. `verify` reads the last "Answer:" line.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator, Sequence

import numpy as np

TASK = "arith"
# Every character the prompts and solutions use; the character tokenizer's vocabulary.
ALPHABET = "0123456789+-*=: \n.?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
NAMES = ("Ann", "Bo", "Cy", "Dee", "Eli", "Fay")
ITEMS = ("pens", "cards", "beads", "stamps", "shells")
# Operand digit counts per difficulty level: (digits of a, digits of b) ranges and ops.
LEVELS = {
    1: dict(digits=(1, 2), ops="+-"),
    2: dict(digits=(2, 3), ops="+-*"),
    3: dict(digits=(3, 4), ops="+-*"),
    4: dict(digits=(4, 5), ops="+-*"),
}
_ANSWER = re.compile(r"Answer:\s*(-?\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Problem:
  """One arith problem.

  Attributes:
    a, b: operands (a ≥ b for −; b is one digit for ×).
    op: "+", "-" or "*".
    level: difficulty level.
    name, item: the word-problem wording.
  """
  a: int
  b: int
  op: str
  level: int
  name: str = "Ann"
  item: str = "pens"

  @property
  def answer(self) -> int:
    """The exact result."""
    return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

  @property
  def prompt(self) -> str:
    """The question, ending with a newline (the solution starts on the next line)."""
    if self.op == "+":
      text = f"{self.name} has {self.a} {self.item} and gets {self.b} more. How many now?"
    elif self.op == "-":
      text = f"{self.name} has {self.a} {self.item} and gives away {self.b}. How many left?"
    else:
      text = f"{self.name} buys {self.a} boxes of {self.b} {self.item}. How many in all?"
    return text + "\n"

  @property
  def solution(self) -> str:
    """The digit-serial worked solution and the answer line (no end-of-text token)."""
    return "".join(line + "\n" for line in solution_lines(self.a, self.b, self.op)) + (
        f"Answer: {self.answer}")

  @property
  def direct_solution(self) -> str:
    """The answer line alone, without the worked steps."""
    return f"Answer: {self.answer}"

  def to_json(self) -> dict:
    """The JSONL record (`prompt`, `answer`, `task`, `metadata`)."""
    return {"prompt": self.prompt, "answer": str(self.answer), "task": TASK,
            "metadata": {"a": self.a, "b": self.b, "op": self.op, "level": self.level,
                         "solution": self.solution}}


def _digits(n: int) -> list[int]:
  """Decimal digits, least significant first."""
  return [int(c) for c in str(n)[::-1]]


def solution_lines(a: int, b: int, op: str, drops: Sequence[bool] = ()) -> list[str]:
  """One line per digit of the result, least significant first.

  +: "{a_i}+{b_i}+{carry}={digit} c{carry'}"; −: "{a_i}-{b_i}-{borrow}={digit}
  b{borrow'}"; ×: "{a_i}*{b}+{carry}={digit} c{carry'}" (b one digit). A last
  carry beyond a's digits gets its own line ("0+0+1=1 c0", "0*b+c=c c0").

  `drops[i]` true makes line i ignore the carry (or borrow) coming into it, as a
  careless teacher would: the line writes "+0" and the rest of the solution follows
  from that slip consistently, so the answer line is wrong exactly when a dropped
  carry was not 0 (`slipped_solution`).
  """
  da, db = _digits(a), _digits(b)

  def dropped(i: int) -> bool:
    return i < len(drops) and bool(drops[i])

  lines = []
  if op == "*":
    if b > 9:
      raise ValueError(f"b={b}: the multiplier must be one digit.")
    carry = 0
    for i in range(len(da)):
      carry = 0 if dropped(i) else carry
      value = da[i] * b + carry
      lines.append(f"{da[i]}*{b}+{carry}={value % 10} c{value // 10}")
      carry = value // 10
    if carry and not dropped(len(da)):
      lines.append(f"0*{b}+{carry}={carry} c0")
    return lines
  width = max(len(da), len(db))
  da, db = da + [0] * (width - len(da)), db + [0] * (width - len(db))
  carry = 0
  for i in range(width):
    carry = 0 if dropped(i) else carry
    if op == "+":
      value = da[i] + db[i] + carry
      lines.append(f"{da[i]}+{db[i]}+{carry}={value % 10} c{value // 10}")
      carry = value // 10
    elif op == "-":
      value = da[i] - db[i] - carry
      borrow = int(value < 0)
      lines.append(f"{da[i]}-{db[i]}-{carry}={value + 10 * borrow} b{borrow}")
      carry = borrow
    else:
      raise ValueError(f"op={op!r}; allowed: '+', '-', '*'.")
  if op == "+" and carry and not dropped(width):
    lines.append(f"0+0+{carry}={carry} c0")
  return lines


def answer_of_lines(lines: Sequence[str]) -> int:
  """The number a solution's lines spell: one result digit per line, least significant
  first (the format of every operation)."""
  digits = "".join(line.split("=")[1].split(" ")[0] for line in lines)
  return int(digits[::-1])


def slipped_solution(problem: "Problem", rng: np.random.Generator, slip_rate: float) -> str:
  """The worked solution of a teacher that drops each incoming carry or borrow with
  probability `slip_rate` (`solution_lines`' drops); its answer line is what its lines
  spell, so a slip on a real carry makes the whole demonstration wrong."""
  if not 0.0 <= slip_rate <= 1.0:
    raise ValueError(f"slip_rate={slip_rate} must be in [0, 1].")
  drops = rng.random(max(len(str(problem.a)), len(str(problem.b))) + 1) < slip_rate
  lines = solution_lines(problem.a, problem.b, problem.op, drops)
  return "".join(line + "\n" for line in lines) + f"Answer: {answer_of_lines(lines)}"


def sample_problem(rng: np.random.Generator, level: int) -> Problem:
  """One random problem of the given difficulty level."""
  if level not in LEVELS:
    raise ValueError(f"level={level}; allowed: {sorted(LEVELS)}.")
  spec = LEVELS[level]
  op = spec["ops"][rng.integers(len(spec["ops"]))]
  low, high = spec["digits"]

  def number(digits):
    return int(rng.integers(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits))

  a = number(int(rng.integers(low, high + 1)))
  b = int(rng.integers(2, 10)) if op == "*" else number(int(rng.integers(low, high + 1)))
  if op == "-" and b > a:
    a, b = b, a
  return Problem(a=a, b=b, op=op, level=level, name=NAMES[rng.integers(len(NAMES))],
                 item=ITEMS[rng.integers(len(ITEMS))])


def generate(seed: int, count: int, levels: tuple[int, ...] = (1, 2, 3),
             weights: tuple[float, ...] | None = None) -> Iterator[Problem]:
  """`count` problems, deterministic in `seed`, levels drawn with `weights`."""
  rng = np.random.default_rng(seed)
  probs = None if weights is None else np.asarray(weights, float) / np.sum(weights)
  for _ in range(count):
    yield sample_problem(rng, int(rng.choice(levels, p=probs)))


def extract_answer(response: str) -> str | None:
  """The number on the response's last non-empty line if it reads "Answer: N", else None."""
  lines = [line for line in response.strip().split("\n") if line.strip()]
  if not lines:
    return None
  match = _ANSWER.search(lines[-1].strip())
  return match.group(1) if match else None


def verify(response: str, answer: str) -> bool:
  """Whether the response's final answer line equals `answer` (as integers)."""
  got = extract_answer(response)
  return got is not None and int(got) == int(answer)


# The token the arith task puts before every prompt (its chat-like format).
PROMPT_PREFIX = ("<|im_start|>",)


def examples(seed: int, count: int, levels: tuple[int, ...] = (1, 2, 3),
             weights: tuple[float, ...] | None = None) -> list:
  """`count` generated problems as `rlhf_jax.data.Example`s (prompt, answer, task)."""
  from rlhf_jax.data import Example
  return [Example(**p.to_json()) for p in generate(seed, count, levels, weights)]


def tokenizer():
  """The character tokenizer of the task (`ALPHABET` plus special tokens)."""
  from rlhf_jax import models
  return models.build_character_tokenizer(ALPHABET)


def model_config(*, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                 max_positions: int):
  """The tiny decoder of the task: GQA with half the heads as KV heads, MLP 3× wide."""
  from rlhf_jax import models
  return models.DecoderConfig(
      vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
      num_heads=num_heads, num_kv_heads=max(1, num_heads // 2),
      head_dim=hidden_size // num_heads, intermediate_size=3 * hidden_size,
      max_position_embeddings=max_positions)
