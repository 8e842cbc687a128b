"""Benchmark files as they are published (GSM8K test, MATH-500, AIME 2024 and 2025), read
with the flag lines docs/byo.md gives for them, on hand-written rows in each layout: the
rows become the prompts and references the published answers say, scored by the math
verifier, broken down by MATH-500's level."""

import json
import pathlib
import re

import pytest

from rlhf_jax.rewards.router import router_for_tasks
from rlhf_jax.rollout.evaluation import breakdown_labels
from rlhf_jax.training import inputs
from rlhf_jax.training.config import base_config

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Rows in each published layout (the benchmarks' own field names and value types), with
# the prompt and reference each must give and a response each reference accepts.
LAYOUTS = {
    "GSM8K test": (
        [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold "
                      "half as many clips in May. How many clips did Natalia sell altogether?",
          "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold "
                    "48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"},
         {"question": "A shop sells 1,200 pens a day. How many in 2 days?",
          "answer": "1,200 * 2 = 2,400\n#### 2,400"}],
        [("Natalia sold clips", "72", "72"), ("A shop sells", "2400", "So:\n2400")]),
    "MATH-500": (
        [{"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar "
                     "coordinates.",
          "solution": "We have that $r = 3$ ... so the answer is "
                      "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
          "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus",
          "level": 2, "unique_id": "test/precalculus/807.json"},
         {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "$\\boxed{3/4}$",
          "answer": "\\frac{3}{4}", "subject": "Prealgebra", "level": 1,
          "unique_id": "test/prealgebra/1.json"}],
        [("Convert the point", "\\left( 3, \\frac{\\pi}{2} \\right)",
          "\\boxed{(3, \\pi/2)}"),
         ("What is", "\\frac{3}{4}", "0.75")]),
    "AIME 2024": (
        [{"id": 60, "problem": "Every morning Aya goes for a 9-kilometer-long walk ...",
          "solution": "... so the answer is $\\boxed{204}$.", "answer": "204",
          "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/"
                 "Problem_1", "year": "2024"}],
        [("Every morning Aya", "204", "Answer: 204")]),
    "AIME 2025": (
        [{"question": "Find the sum of all integer bases $b > 9$ for which $17_b$ is a "
                      "divisor of $97_b$.", "answer": "70"},
         {"question": "An exported row whose answer is a number.", "answer": 588}],
        [("Find the sum", "70", "The bases are 21 and 49.\n70"),
         ("An exported row", "588", "$588$")]),
}


def documented_flags(benchmark: str) -> dict[str, str]:
  """The `--config.data.<field>=<value>` flags of `benchmark`'s row in docs/byo.md's
  "Evaluating on published benchmarks" table."""
  page = (ROOT / "docs" / "byo.md").read_text()
  section = page.split("## Evaluating on published benchmarks", 1)[1].split("\n## ", 1)[0]
  (row,) = [line for line in section.splitlines() if line.startswith(f"| {benchmark} |")]
  flags = re.findall(r"--config\.data\.(\w+)=(\S+?)(?=\s|`)", row.rsplit("|", 2)[1])
  assert flags, row
  return dict(flags)


@pytest.fixture(scope="module")
def scorer():
  scorer = router_for_tasks(["math"], workers=1)
  yield scorer
  scorer.close()


@pytest.mark.parametrize("benchmark", sorted(LAYOUTS))
def test_a_published_benchmark_file_reads_and_scores_with_its_documented_flags(
    benchmark, scorer, tmp_path):
  rows, expected = LAYOUTS[benchmark]
  path = tmp_path / "benchmark.jsonl"
  path.write_text("".join(json.dumps(row) + "\n" for row in rows))
  config = base_config("hf")
  for field, value in documented_flags(benchmark).items():
    config.data[field] = value
  config.data.eval_file = str(path)
  _, examples = inputs.load_examples(config)
  assert len(examples) == len(expected)
  for example, (prompt_start, reference, _) in zip(examples, expected):
    assert example.prompt.startswith(prompt_start) and example.answer == reference
    assert example.task == "math"
  scored = scorer.score(examples, [response for _, _, response in expected])
  assert scored.correct == [True] * len(expected), scored.reasons
  # A wrong and an empty answer: wrong, and "no answer found" (counted, not a silent 0).
  wrong = scorer.score(examples[:1] * 2, ["Answer: 123456789", "I could not solve it."])
  assert wrong.correct == [False, False] and wrong.reasons[1] == "no answer found"
  assert wrong.extracted == ["123456789", None]
  if benchmark == "MATH-500":  # the report's breakdown per level
    assert breakdown_labels(examples)["level"] == ["2", "1"]
