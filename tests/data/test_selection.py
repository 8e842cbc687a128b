"""Pre-PPO selection: per-task normalisation, the kept fraction, the launcher."""

import json
import subprocess
import sys

import numpy as np
import pytest

from rlhf_jax.data import Example
from rlhf_jax.data import selection
from tests.launch.runs import ROOT
from tests.launch.runs import SMALL


def test_normalise_per_task_is_a_z_score_within_each_task():
  tasks = ["a", "b", "a", "b", "a", "c"]
  scores = [1.0, 10.0, 2.0, 30.0, 3.0, 5.0]
  got = selection.normalise_per_task(tasks, scores)
  a = np.array([1.0, 2.0, 3.0])
  b = np.array([10.0, 30.0])
  np.testing.assert_allclose(got[[0, 2, 4]], (a - 2.0) / np.sqrt(2 / 3))
  np.testing.assert_allclose(got[[1, 3]], [-1.0, 1.0])
  assert got[5] == 0.0  # one prompt: no spread


def test_select_hardest_keeps_the_lowest_normalised_fraction():
  # Task "easy" has high raw scores, "hard" low ones: raw scores alone would pick
  # only "hard"; per task, each task's weakest prompts are picked.
  examples = [Example(f"q{i}", "", task) for i, task in
              enumerate(["easy"] * 5 + ["hard"] * 5)]
  scores = [0.9, 0.5, 0.95, 0.99, 0.97, 0.1, 0.0, 0.2, 0.3, 0.25]
  kept = selection.select_hardest(examples, scores, fraction=0.2)
  assert [s.example.prompt for s in kept] == ["q1", "q6"]
  assert kept[0].score == 0.5 and kept[0].normalised < 0
  assert len(selection.select_hardest(examples, scores, fraction=0.01)) == 1
  with pytest.raises(ValueError, match="fraction=0"):
    selection.select_hardest(examples, scores, fraction=0)


def test_select_prompts_batches_and_annotates():
  examples = [Example(str(i), "", "t") for i in range(7)]
  calls = []

  def score_fn(chunk):
    calls.append(len(chunk))
    return [[int(e.prompt) % 4, 1.0] for e in chunk]

  kept = selection.select_prompts(examples, score_fn, fraction=0.3, batch_size=3)
  assert calls == [3, 3, 1]
  assert [s.example.prompt for s in kept] == ["0", "4"]  # means 0.5, 0.5: ties in order
  out = selection.annotated(kept)
  assert out[0].metadata["prepo_score"] == 0.5 and "prepo_normalised" in out[0].metadata
  with pytest.raises(ValueError, match="score_fn must return"):
    selection.select_prompts(examples, lambda chunk: [[]] * len(chunk))


@pytest.mark.slow
def test_select_prompts_launcher_on_a_tiny_policy(tmp_path):
  def run(script, *args):
    return subprocess.run([sys.executable, f"launch/{script}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)

  result = run("sft.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}", *SMALL)
  assert result.returncode == 0, result.stderr[-3000:]
  output = tmp_path / "hard.jsonl"
  result = run("select_prompts.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}",
               f"--output={output}", "--fraction=0.25", "--samples=2", "--max_prompts=16",
               *SMALL)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["candidates"] == 16 and report["kept"] == 4
  rows = [json.loads(line) for line in output.read_text().splitlines()]
  assert len(rows) == 4 and all("prepo_score" in r["metadata"] for r in rows)
  normalised = [r["metadata"]["prepo_normalised"] for r in rows]
  assert normalised == sorted(normalised)
  result = run("select_prompts.py", "--config=configs/dapo.py:arith", f"--workdir={tmp_path}",
               f"--output={output}", "--fraction=2")
  assert result.returncode == 2 and "--fraction=2.0 must be in (0, 1]" in result.stderr
