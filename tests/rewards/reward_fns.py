"""Reward functions in other libraries' signatures, for tests/rewards/test_function_scorer.py
(module-level: they run in worker processes)."""

import asyncio
import time


def solution_match(prompts, completions, solution, **kwargs):
  """TRL's signature, reading the file's own `solution` column (as TRL's examples do)."""
  assert len(prompts) == len(completions) == len(solution) == len(kwargs["completion_ids"])
  return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def echo_columns(prompts, completions, **kwargs):
  """Encodes what it was given in the reward: 1000 × len(prompt) + len(completion ids)."""
  return [1000.0 * len(p) + len(ids) for p, ids in zip(prompts, kwargs["completion_ids"])]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  """verl's signature; a dict with the score and another number to log."""
  return {"score": float(solution_str.strip() == ground_truth), "length": len(solution_str),
          "source_is_gsm8k": float(data_source == "openai/gsm8k"),
          "index": float((extra_info or {}).get("index", -1))}


async def async_length(prompts, completions, **kwargs):
  """An `async def` function (awaited)."""
  await asyncio.sleep(0)
  return [float(len(c)) for c in completions]


def only_short(prompts, completions, **kwargs):
  """None for long completions: not scored by this function."""
  return [1.0 if len(c) < 3 else None for c in completions]


def raises(prompts, completions, **kwargs):
  raise RuntimeError("boom")


def hangs(prompts, completions, **kwargs):
  time.sleep(60)
  return [0.0] * len(completions)


def wrong_length(prompts, completions, **kwargs):
  return [0.0]


def wrong_type(prompts, completions, **kwargs):
  return ["high"] * len(completions)


def not_a_list(prompts, completions, **kwargs):
  return 1.0


def no_convention(text):
  return 0.0


NOT_CALLABLE = 3


def half_credit(prompts, completions, **kwargs):
  """Full marks for one character, half for more."""
  return [1.0 if len(c) == 1 else 0.5 for c in completions]


def verl_with_acc(data_source, solution_str, ground_truth, extra_info=None):
  """verl's dict with its own verdict beside a score."""
  return {"score": 0.25, "acc": len(solution_str) == 1}


def verl_without_extra_info(data_source, solution_str, ground_truth):
  """verl's signature without the optional extra_info."""
  return float(solution_str == ground_truth)


def trl_named_only(completions, solution):
  """TRL's signature reading only what it names (no **kwargs)."""
  return [float(c == s) for c, s in zip(completions, solution)]


def batch_size(prompts, completions, **kwargs):
  """Every sample's reward is the number of samples in the call (a function that
  normalises across the batch sees all of it only when it gets the whole step)."""
  return [float(len(completions))] * len(completions)


def numpy_lengths(prompts, completions, **kwargs):
  """A NumPy array as the result (TRL accepts any sequence of floats)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.asarray([len(c) for c in completions], np.float32)


_LIMIT = asyncio.Semaphore(2)  # module level, as async HTTP clients are kept


async def async_bounded(prompts, completions, **kwargs):
  """An `async def` function behind a module-level semaphore: it must run on the same
  event loop on every call (a new loop per call: 'bound to a different event loop')."""
  async def one(c):
    async with _LIMIT:
      await asyncio.sleep(0)
      return float(len(c))
  return list(await asyncio.gather(*(one(c) for c in completions)))


class _Unprintable(Exception):
  def __str__(self):
    raise RuntimeError("no message for you")


def unprintable_error(prompts, completions, **kwargs):
  """Raises an exception whose __str__ raises."""
  raise _Unprintable()


def chatty(prompts, completions, **kwargs):
  """Prints 3 MB (a debugging print left in a loop) and scores 1."""
  import sys  # pylint: disable=import-outside-toplevel
  for _ in range(3000):
    print("x" * 1023)
  sys.stderr.write("done\n")
  return [1.0] * len(completions)


def prints_then_raises(prompts, completions, **kwargs):
  """Prints a diagnostic, then raises: the diagnostic is what the user needs to see."""
  print("diagnostic: the answer column is missing")
  raise KeyError("answer")


def verl_bool_score(data_source, solution_str, ground_truth, extra_info=None):
  """verl's dict with a bool score (a bare True is 1.0 too)."""
  return {"score": solution_str == ground_truth} if solution_str else True
