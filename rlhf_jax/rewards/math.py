"""Math-answer verification: extract a response's final answer, test equivalence.

    extract_answer(text, extractor="auto") -> str | None
    check_extractor(extractor) -> None                      # raises ValueError
    verify(response, answer, *, extractor="auto") -> Judgement

Extractors: "boxed" (the last `\\boxed{...}` or `\\fbox{...}`, nested braces
allowed, an unbalanced last box counts as none), "answer_line" (DAPO's last
`Answer: ...`, case-insensitive, `$...$` and a trailing period stripped),
"gsm8k" (the rest of the line after the last `####`), "last_number" (the last
integer, decimal or fraction), "bare" (a bare final answer, below), "auto" (boxed,
else answer_line, else gsm8k, else bare), or "re:PATTERN" (the first group of the
pattern's last match).

A bare final answer is read only when the response has no `\\boxed{}`, no
`Answer:` line and no `####`: the whole response, stripped of `$...$` / `\\(...\\)`
delimiters, `**` and a final period, when it is one line of at most 64 characters
made of numbers, operators, brackets and LaTeX commands (`7`, `-3.5`, `1/2`,
`\\frac{1}{2}`, `2\\sqrt{3}`: no words); else its last non-empty line when that line,
stripped the same way, is one number (a last line `42` after the working). A
response with a `\\boxed` (even an empty or unbalanced one) has no bare answer, and
"The answer is 12" or a number inside a sentence is none either: auto still never
guesses a number out of prose.
The arith task's verifier is its own (tasks/arith.py: the last "Answer: N" line) and
is not changed by this rule.

Equivalence is math-verify's (github.com/huggingface/Math-Verify): both strings
are parsed as LaTeX or plain expressions (wrapped in `$...$` when they carry no
math delimiters) and compared with SymPy, so `\\frac{1}{2}`, `\\dfrac12`, `0.5`
and `1/2` agree, `x=3` matches `3`, `\\frac{1}{\\sqrt{2}}` matches
`\\frac{\\sqrt{2}}{2}`, and sets, intervals, matrices and percentages compare as
math-verify supports them. `1,234` is one thousand two hundred thirty-four
(math-verify), and so are `1{,}234` and `1\\,234` (normalised here: math-verify
reads `1\\,234` as 235). math-verify's own SIGALRM timeouts are off (they fail
outside the main thread); the router runs `verify` in killable workers with a
deadline.

A `Judgement` carries no score: the router maps correct / wrong to its
`reward.correct_score` / `reward.wrong_score` (DAPO's +1 / -1, or 1 / 0).
"""

from __future__ import annotations

import functools
import re

from rlhf_jax.rewards.scorer import NO_ANSWER
from rlhf_jax.rewards.scorer import Judgement

try:
  import math_verify
except ImportError as e:  # pragma: no cover - depends on the install
  raise ImportError("rlhf_jax.rewards.math needs math-verify: "
                    "pip install 'rlhf-jax[math]'") from e

EXTRACTORS = ("auto", "boxed", "answer_line", "gsm8k", "last_number", "bare")

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(r"(?i)\banswer\s*:[ \t]*([^\n]*)")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?|\.\d+)"
                     r"(?:\s*/\s*\d+)?")
# A bare answer: numbers, operators, brackets and LaTeX commands, no words (module docstring).
_BARE_EXPRESSION = re.compile(r"(?:\\[A-Za-z]+|[0-9\s+\-*/^_.,:(){}\[\]|!=<>])+")
_BARE_MAX_CHARS = 64
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[")
# Digit-group separators math-verify misreads: `1\,234`, `1{,}234`.
_GROUP_SEP = re.compile(r"(?<=\d)(?:\\[,;! ]|\{,\})(?=\d{3}(?!\d))")
_PARSE_CONFIG = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())


def _short(text: str, limit: int = 80) -> str:
  return text if len(text) <= limit else text[:limit - 3] + "..."


@functools.lru_cache(maxsize=64)
def _user_regex(extractor: str) -> re.Pattern[str]:
  """The compiled pattern of a "re:PATTERN" extractor; ValueError if unusable."""
  try:
    pattern = re.compile(extractor[3:])
  except re.error as e:
    raise ValueError(f"bad math extractor regex {extractor[3:]!r}: {e}") from e
  if pattern.groups < 1:
    raise ValueError(f"math extractor regex {extractor[3:]!r} needs a group (the answer)")
  return pattern


def check_extractor(extractor: str) -> None:
  """Raises ValueError unless `extractor` is one of EXTRACTORS or a valid "re:" regex."""
  if isinstance(extractor, str) and extractor.startswith("re:"):
    _user_regex(extractor)
  elif extractor not in EXTRACTORS:
    raise ValueError(f"unknown math extractor {extractor!r}: expected one of "
                     f"{', '.join(EXTRACTORS)} or 're:<regex with a group>'")


def _last_boxed(text: str) -> str | None:
  """The content of the last `\\boxed{...}` / `\\fbox{...}`; None if unbalanced."""
  starts = list(_BOX.finditer(text))
  if not starts:
    return None
  depth = 1
  begin = starts[-1].end()
  for i in range(begin, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[begin:i]
  return None


def _answer_line(text: str) -> str | None:
  """DAPO's last `Answer: ...`, without `$` / `\\(\\)` delimiters or a final period."""
  matches = _ANSWER_LINE.findall(text)
  if not matches:
    return None
  answer = matches[-1].strip().strip("*").strip().rstrip(".").strip()
  for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
    if len(answer) > len(left) + len(right) and answer.startswith(left) and answer.endswith(right):
      answer = answer[len(left):-len(right)].strip()
      break
  return answer.rstrip(".").strip()


def _unwrapped(line: str) -> str:
  """`line` without `**`, `$...$` / `\\(...\\)` / `\\[...\\]` delimiters and a final period."""
  line = line.strip().strip("*").strip().rstrip(".").strip()
  for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
    if len(line) > len(left) + len(right) and line.startswith(left) and line.endswith(right):
      return line[len(left):-len(right)].strip().rstrip(".").strip()
  return line


def _bare_answer(text: str) -> str | None:
  """A bare final answer (module docstring): the whole response when it is one short
  expression of numbers and LaTeX commands, else a last line that is one number."""
  lines = [line for line in text.strip().splitlines() if line.strip()]
  if not lines or _BOX.search(text):  # a box that did not read is not a bare answer
    return None
  whole = _unwrapped(lines[0]) if len(lines) == 1 else ""
  if (whole and len(whole) <= _BARE_MAX_CHARS and _BARE_EXPRESSION.fullmatch(whole)
      and re.search(r"\d|\\[A-Za-z]", whole)):
    return whole
  last = _unwrapped(lines[-1])
  return last if _NUMBER.fullmatch(last) else None


def _last_match(pattern: re.Pattern[str], text: str, group: int = 1) -> str | None:
  matches = list(pattern.finditer(text))
  return matches[-1].group(group) if matches else None


def extract_answer(text: str, extractor: str = "auto") -> str | None:
  """The final-answer substring of a response by `extractor`, or None if it finds none.

  Raises:
    ValueError: unknown extractor or bad "re:" regex.
  """
  check_extractor(extractor)
  if extractor == "auto":
    found = _last_boxed(text)
    if found is None or not found.strip():
      found = _answer_line(text)
    if found is None or not found.strip():
      found = _last_match(_GSM8K, text)
    if found is None or not found.strip():
      found = _bare_answer(text)
  elif extractor == "bare":
    found = _bare_answer(text)
  elif extractor == "boxed":
    found = _last_boxed(text)
  elif extractor == "answer_line":
    found = _answer_line(text)
  elif extractor == "gsm8k":
    found = _last_match(_GSM8K, text)
  elif extractor == "last_number":
    found = _last_match(_NUMBER, text, group=0)
  else:
    found = _last_match(_user_regex(extractor), text)
  found = found.strip() if found is not None else None
  return found or None


def _parse(text: str) -> list:
  """math_verify.parse of `text`, `$`-wrapped first unless it has delimiters.

  [] unless math-verify made a SymPy object of it (a bare string fallback only
  means its LaTeX did not parse).
  """
  text = _GROUP_SEP.sub("", text.strip())
  for candidate in [text] if _DELIMITED.search(text) else [f"${text}$", text]:
    parsed = math_verify.parse(candidate, extraction_config=_PARSE_CONFIG,
                               parsing_timeout=None)
    if any(not isinstance(item, str) for item in parsed):
      return parsed
  return []


def verify(response: str, answer: str, *, extractor: str = "auto") -> Judgement:
  """Whether `response`'s final answer is mathematically equivalent to `answer`.

  Never raises for a bad response or reference (the reason says what went wrong).

  Raises:
    ValueError: unknown extractor or bad "re:" regex (a config error).
  """
  check_extractor(extractor)
  got = None
  try:
    got, answer = extract_answer(response, extractor), str(answer)
    if got is None:
      return Judgement(False, NO_ANSWER)
    if got == answer.strip():
      return Judgement(True, extracted=got)
    gold = _parse(answer)
    if not gold:
      return Judgement(False, f"unparsable reference: {_short(answer)}", extracted=got)
    pred = _parse(got)
    if not pred:
      return Judgement(False, f"unparsable answer: {_short(got)}", extracted=got)
    if math_verify.verify(gold, pred, timeout_seconds=None):
      return Judgement(True, extracted=got)
    return Judgement(False, f"not equivalent: {_short(got, 60)} vs {_short(answer, 60)}",
                     extracted=got)
  except Exception as e:  # pylint: disable=broad-except
    return Judgement(False, _short(f"error: {e!r}", 200), extracted=got)
