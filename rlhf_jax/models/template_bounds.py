"""Cost bounds for rendering a checkpoint's chat template: time, size and recursion.

A chat template is code from whoever made the checkpoint. Jinja's sandbox
(`ImmutableSandboxedEnvironment`) stops it reaching Python's internals, but not from
spending time and memory: nested loops ran for 72 s, `'a' * 3000000000` took 8 GB, a
recursive macro ended in a 1,418-line traceback. Each render here is bounded in-process,
at a cost of microseconds, so every prompt (not a sample of them at load) is covered:

- Size: no value a template makes may exceed `MAX_CHARS` characters (16 Mi; a long
  conversation is ~1 Mi): `*` and `+` are intercepted and refused when the result would be
  larger (before it is allocated), `~` (concatenation) is compiled to a checked join, every
  call, filter and method is refused an integer argument or format width above
  `MAX_WIDTH` (`center`, `indent`, `'%9999999999s'`) and its result is checked (a lazy
  result, such as `map`'s, item by item), and so are the namespace's attributes and the
  rendered output.
- Time: a render (and the compile of the template) runs under a deadline; one watchdog
  thread for the process raises `TemplateTimeout` in the rendering thread when it passes
  (`PyThreadState_SetAsyncExc`: delivered at the next bytecode, so it stops any Jinja
  loop; the C-level operations that could hold it off longer are the ones sized above).
- Recursion: Python's own limit, turned into one line (RecursionError is caught, and
  Jinja's traceback rewriting is not shown).

A killable worker process per render would bound memory too, but costs a process start
per prompt; the bounds above keep every allocation a template controls below a few times
`MAX_CHARS`. Errors are `ChatTemplateError`s (a one-line ValueError); the tokenizer adds
the file the template came from.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import heapq
import itertools
import operator
import re
import threading
import time
from typing import Any, Iterator

MAX_CHARS = 1 << 24  # characters (or list items) of any value a template makes
MAX_WIDTH = 1 << 16  # an integer argument of a call, or a width in a format string
DEFAULT_TIMEOUT_S = 10.0  # `data.template_timeout_s`: a render takes milliseconds
# Widths and precisions of printf-style ('%-12.3f') and str.format ('{:>12}') specs.
_FORMAT_WIDTHS = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)")


class TemplateBoundError(ValueError):
  """A template that went past a bound (the message says which)."""


class TemplateTimeout(BaseException):
  """Raised in a rendering thread whose deadline passed. A BaseException, so that no
  `except Exception` in Jinja's code (its traceback rewriting) handles it first."""


def size(value: Any, depth: int = 0) -> int:
  """Characters of a string; items plus their sizes for lists, tuples and dicts (three
  levels deep: enough to see a list of big strings); 0 for anything else."""
  if isinstance(value, str):
    return len(value)
  if depth > 2:
    return len(value) if isinstance(value, (list, tuple, dict)) else 0
  if isinstance(value, (list, tuple)):
    return len(value) + sum(size(v, depth + 1) for v in value)
  if isinstance(value, dict):
    return len(value) + sum(size(k, depth + 1) + size(v, depth + 1) for k, v in value.items())
  return 0


def checked(value: Any, what: str) -> Any:
  """`value`, or TemplateBoundError when it is larger than MAX_CHARS."""
  if size(value) > MAX_CHARS:
    raise TemplateBoundError(f"the chat template made a value of more than {MAX_CHARS} "
                             f"characters ({what})")
  return value


def check_format(text: Any, what: str) -> None:
  """TemplateBoundError when a format string asks for a width above MAX_WIDTH."""
  if isinstance(text, str) and ("%" in text or "{" in text):
    for match in _FORMAT_WIDTHS.finditer(text):
      if any(n and int(n) > MAX_WIDTH for n in match.groups()):
        raise TemplateBoundError(f"the chat template asked for a width of more than "
                                 f"{MAX_WIDTH} characters ({what}: {match.group(0)[:20]!r})")


def check_arguments(args, kwargs, what: str) -> None:
  """TemplateBoundError for an integer argument above MAX_WIDTH, or an argument larger
  than MAX_CHARS."""
  for value in itertools.chain(args, kwargs.values()):
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_WIDTH:
      raise TemplateBoundError(f"the chat template passed {value} to {what} (at most "
                               f"{MAX_WIDTH})")
    checked(value, f"an argument of {what}")


def bounded_result(value: Any, what: str) -> Any:
  """A call's result, checked; a generator wrapped so that its items are checked as they
  come (their sizes summed)."""
  if isinstance(value, Iterator) and not isinstance(value, (str, list, tuple, dict)):
    return _bounded_items(value, what)
  return checked(value, what)


def _bounded_items(items: Iterator, what: str) -> Iterator:
  total = 0
  for item in items:
    total += size(item) + 1
    if total > MAX_CHARS:
      raise TemplateBoundError(f"the chat template made more than {MAX_CHARS} characters "
                               f"({what})")
    yield item


def bounded_filter(function):
  """A Jinja filter (or test) whose arguments and result are checked; Jinja's
  pass_context / pass_eval_ctx marks are kept (functools.wraps copies them)."""
  @functools.wraps(function)
  def wrapper(*args, **kwargs):
    name = f"the filter {function.__name__!r}"
    check_arguments(args, kwargs, name)
    if function.__name__ == "do_format" and args:  # do_format(format_string, *values)
      check_format(args[0], name)
    return bounded_result(function(*args, **kwargs), name)
  return wrapper


def binop(name: str, left: Any, right: Any) -> Any:
  """`left <name> right` for the intercepted operators, refused when the result would
  be larger than MAX_CHARS (before it is made) or a power's result too long an integer."""
  if name == "*":
    for sequence, count in ((left, right), (right, left)):
      if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
        if size(sequence) * max(count, 0) > MAX_CHARS:
          raise TemplateBoundError(f"the chat template repeats a value of {size(sequence)} "
                                   f"characters {count} times (at most {MAX_CHARS} in all)")
  elif name == "+" and isinstance(left, (str, list, tuple)):
    if size(left) + size(right) > MAX_CHARS:
      raise TemplateBoundError(f"the chat template made a value of more than {MAX_CHARS} "
                               "characters (a sum)")
  elif name == "**" and isinstance(left, int) and isinstance(right, int):
    if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 64 * MAX_WIDTH:
      raise TemplateBoundError(f"the chat template raised {left} to the power {right}")
  elif name == "%":
    check_format(left, "the % operator")
  return checked(_OPERATORS[name](left, right), f"the {name} operator")


_OPERATORS = {"*": operator.mul, "+": operator.add, "**": operator.pow, "%": operator.mod}
INTERCEPTED = frozenset(_OPERATORS)


class _Watchdog:
  """One daemon thread that raises TemplateTimeout in threads past their deadline."""

  def __init__(self):
    self._condition = threading.Condition()
    self._due: list[tuple[float, int, int]] = []  # (deadline, token, thread id) heap
    self._armed: set[int] = set()
    self._tokens = itertools.count()
    self._thread: threading.Thread | None = None

  def arm(self, seconds: float) -> int:
    token = next(self._tokens)
    with self._condition:
      heapq.heappush(self._due, (time.monotonic() + seconds, token, threading.get_ident()))
      self._armed.add(token)
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, name="chat-template-watchdog",
                                        daemon=True)
        self._thread.start()
      self._condition.notify()
    return token

  def disarm(self, token: int) -> bool:
    """Whether the deadline of `token` had passed (TemplateTimeout was raised)."""
    with self._condition:
      if token in self._armed:
        self._armed.discard(token)
        return False
      return True

  def _run(self) -> None:
    with self._condition:
      while True:
        while self._due and self._due[0][1] not in self._armed:
          heapq.heappop(self._due)  # finished in time
        if not self._due:
          self._condition.wait()
          continue
        deadline, token, thread = self._due[0]
        if time.monotonic() < deadline:
          self._condition.wait(deadline - time.monotonic())
          continue
        heapq.heappop(self._due)
        self._armed.discard(token)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                                   ctypes.py_object(TemplateTimeout))


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def deadline(seconds: float, what: str):
  """Runs the block with a deadline of `seconds`; past it, TemplateBoundError naming
  `what`. A RecursionError or MemoryError in the block is one line too."""
  token = _WATCHDOG.arm(seconds)
  delivered = False
  try:
    yield
  except TemplateTimeout:
    delivered = True
    raise TemplateBoundError(f"{what} took more than {seconds:g} s "
                             "(data.template_timeout_s)") from None
  except RecursionError:
    raise TemplateBoundError(f"{what} recursed too deeply (Python's recursion "
                             "limit)") from None
  except MemoryError:
    raise TemplateBoundError(f"{what} ran out of memory") from None
  finally:
    try:
      if _WATCHDOG.disarm(token) and not delivered:
        # Raised just as the block ended: it arrives within a few bytecodes; take it here.
        for _ in range(10_000_000):
          pass
    except TemplateTimeout:
      pass
