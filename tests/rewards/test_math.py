"""Math-answer verification: extractors, equivalence by math-verify, and failure reasons."""

import importlib
import sys

import hypothesis
from hypothesis import strategies as st
import pytest

from rlhf_jax.rewards import math as math_lib
from rlhf_jax.rewards.scorer import Judgement


@pytest.mark.parametrize("response, answer", [
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{1/2}", r"\frac{1}{2}"),
    (r"\boxed{\dfrac{3}{4}}", "0.75"),
    (r"\boxed{\dfrac34}", "3/4"),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}"),
    (r"\boxed{\sqrt{2}}", r"\sqrt2"),
    (r"\boxed{-7}", "-7"),
    (r"\boxed{-\frac{1}{2}}", "-0.5"),
    (r"\boxed{3.0}", "3"),
    (r"\boxed{x=3}", "3"),
    (r"\boxed{3}", "x=3"),
    (r"\boxed{2x+2}", "2(x+1)"),
    (r"\boxed{[1,2)}", "[1, 2)"),
    (r"\boxed{\{1,2\}}", r"\{2, 1\}"),
    (r"\boxed{\pi}", r"\pi"),
    (r"\fbox{5}", "5"),
    (r"so $\boxed{12}$ apples", "12"),
    ("Answer: 42", "42"),
    ("answer: $42$.", "42"),
    ("**Answer:** 12.", "12"),
    (r"Answer: \(\frac{1}{2}\)", "0.5"),
    ("#### 1,234", "1234"),
    ("#### 1234", "1,234"),
    (r"\boxed{1,234,567}", "1234567"),
    (r"\boxed{1{,}234}", "1234"),
    (r"\boxed{1\,234}", "1234"),  # a LaTeX thin space separates digit groups
])
def test_equivalent(response, answer):
  assert math_lib.verify(response, answer) == Judgement(True)


@pytest.mark.parametrize("response, answer", [
    (r"\boxed{7}", "-7"),
    (r"\boxed{\frac{1}{3}}", "0.33"),
    (r"\boxed{(1,2]}", "[1,2)"),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}"),
    (r"\boxed{1,23}", "123"),  # not a thousands group: the set {1, 23}
    (r"\boxed{x=4}", "3"),
    ("Answer: 41", "42"),
])
def test_not_equivalent(response, answer):
  judgement = math_lib.verify(response, answer)
  assert not judgement.correct
  assert judgement.reason.startswith("not equivalent: ")
  assert judgement.score is None


def test_not_equivalent_reason_names_both_and_truncates():
  assert math_lib.verify(r"\boxed{4}", "5").reason == "not equivalent: 4 vs 5"
  reason = math_lib.verify(r"\boxed{" + "1+" * 100 + "1}", "5").reason
  assert len(reason) < 150 and reason.endswith("vs 5")


@pytest.mark.parametrize("response", [
    "", "I think this problem is hard.", r"\boxed{\frac{1}{2}", r"\boxed{}", "Answer:",
    "The answer is 12",  # auto never guesses a bare number
])
def test_no_answer_found(response):
  assert math_lib.verify(response, "12") == Judgement(False, "no answer found")


def test_unparsable_answer_and_reference():
  assert math_lib.verify(r"\boxed{\frac{1}}", "1").reason == r"unparsable answer: \frac{1}"
  assert math_lib.verify("Answer: ???", "1").reason == "unparsable answer: ???"
  long = math_lib.verify("Answer: " + "\\frac{" * 50, "1").reason
  assert long.startswith("unparsable answer: ") and len(long) <= len("unparsable answer: ") + 80
  assert math_lib.verify(r"\boxed{5}", r"\frac{").reason == r"unparsable reference: \frac{"
  assert math_lib.verify(r"\boxed{5}", "").reason == "unparsable reference: "


def test_last_boxed_wins():
  response = r"First \boxed{3}, then correcting: \boxed{\frac{8}{2}}"
  assert math_lib.extract_answer(response, "boxed") == r"\frac{8}{2}"
  assert math_lib.verify(response, "4").correct
  assert not math_lib.verify(response, "3").correct


def test_extractors():
  text = "x-3 gives 5/6, then -2.5\nAnswer: $7$.\n#### 1,234\n"
  assert math_lib.extract_answer(text, "answer_line") == "7"
  assert math_lib.extract_answer(text, "gsm8k") == "1,234"
  assert math_lib.extract_answer(text, "last_number") == "1,234"
  assert math_lib.extract_answer("x-3 gives 5/6 or -2.5", "last_number") == "-2.5"
  assert math_lib.extract_answer("x-3", "last_number") == "3"
  assert math_lib.extract_answer("of 5 / 6.", "last_number") == "5 / 6"
  assert math_lib.extract_answer(r"\boxed{\boxed{2}+1}", "boxed") == "2"
  assert math_lib.extract_answer(r"\boxed{a{b{c}}d} end", "boxed") == "a{b{c}}d"
  # auto: boxed before the answer line before gsm8k
  assert math_lib.extract_answer(text + r"\boxed{9}") == "9"
  assert math_lib.extract_answer(text) == "7"
  assert math_lib.extract_answer("so\n#### 1,234") == "1,234"
  assert math_lib.extract_answer("no box here", "boxed") is None


def test_user_regex_extractor():
  extractor = r"re:RESULT=(\S+)"
  math_lib.check_extractor(extractor)
  response = r"RESULT=1 ... RESULT=\frac{3}{2}"
  assert math_lib.extract_answer(response, extractor) == r"\frac{3}{2}"
  assert math_lib.verify(response, "1.5", extractor=extractor).correct
  assert math_lib.verify("nothing", "1.5", extractor=extractor).reason == "no answer found"


@pytest.mark.parametrize("extractor, message", [
    ("boxxed", "boxxed"), ("", "auto"), ("re:(unclosed", "unclosed"), ("re:no group", "group"),
])
def test_bad_extractor_raises(extractor, message):
  for call in (lambda: math_lib.check_extractor(extractor),
               lambda: math_lib.extract_answer("x", extractor),
               lambda: math_lib.verify("x", "1", extractor=extractor)):
    with pytest.raises(ValueError, match=message):
      call()


def test_all_named_extractors_are_valid():
  for extractor in math_lib.EXTRACTORS:
    math_lib.check_extractor(extractor)


_LATEXISH = st.text(alphabet="0123456789{}\\$,./-=()[]xy boxedfracsqrt#:Answer\n", max_size=80)


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(
    response=st.one_of(st.text(max_size=200), _LATEXISH,
                       _LATEXISH.map(lambda s: r"\boxed{" + s + "}")),
    answer=st.one_of(st.sampled_from(["42", r"\frac{1}{2}", "x=3", "[1,2)"]), _LATEXISH),
    extractor=st.sampled_from(math_lib.EXTRACTORS + (r"re:(\d+)",)))
def test_verify_never_raises(response, answer, extractor):
  judgement = math_lib.verify(response, answer, extractor=extractor)
  assert isinstance(judgement, Judgement) and judgement.score is None
  assert judgement.correct == (judgement.reason == "")


def test_import_error_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` fails
  monkeypatch.delitem(sys.modules, "rlhf_jax.rewards.math")
  with pytest.raises(ImportError, match=r"pip install 'rlhf-jax\[math\]'"):
    importlib.import_module("rlhf_jax.rewards.math")


@pytest.mark.parametrize("response, extracted", [
    ("7", "7"), ("  $7$. ", "7"), ("-3.5", "-3.5"), (r"\frac{1}{2}", r"\frac{1}{2}"),
    (r"\(2\sqrt{3}\)", r"2\sqrt{3}"), ("**12**", "12"), ("1/2", "1/2"),
    ("We add 3 and 4.\nSo the total is\n7", "7"), ("Adding:\n$7$.", "7"),
])
def test_bare_final_answer_is_read_when_nothing_else_is(response, extracted):
  assert math_lib.extract_answer(response) == extracted
  assert math_lib.extract_answer(response, "bare") == extracted
  assert math_lib.verify(response, extracted) == Judgement(True)
  assert math_lib.verify(response, extracted).extracted == extracted


@pytest.mark.parametrize("response", [
    "The answer is 7", "7 apples", "x = 7", "so it is\n7 apples", "yes", r"\boxed{}",
    r"\boxed{7", "7\nand that is all", "I think 7.",
])
def test_no_bare_answer_in_prose_or_beside_a_box(response):
  assert math_lib.extract_answer(response) is None
  assert math_lib.verify(response, "7") == Judgement(False, "no answer found")
  assert math_lib.verify(response, "7").extracted is None


def test_a_boxed_or_answer_line_answer_wins_over_a_bare_last_line():
  assert math_lib.extract_answer("Answer: 5\n7") == "5"
  assert math_lib.extract_answer(r"\boxed{5}" + "\n7") == "5"
  assert math_lib.extract_answer("#### 5\n7") == "5"


def test_the_verdict_carries_the_answer_it_read():
  assert math_lib.verify(r"\boxed{0.5}", r"\frac{1}{2}").extracted == "0.5"
  wrong = math_lib.verify("Answer: 41", "42")
  assert wrong.extracted == "41" and not wrong.correct
  assert math_lib.verify(r"\boxed{\frac{1}}", "1").extracted == r"\frac{1}"


def test_the_arith_verifier_still_refuses_a_bare_answer():
  from rlhf_jax.tasks import arith
  assert not arith.verify("7", "7") and not arith.verify("3 + 4\n7", "7")
  assert arith.verify("3 + 4 = 7\nAnswer: 7", "7")
