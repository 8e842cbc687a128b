"""The red team's hostile inputs against the bounds on what a checkpoint and a
data file can make the trainer do (models/template_bounds.py, data/prompts.py): chat
templates that loop, allocate or recurse without end, and a 50 MB data row, each run in a
child process with a wall-clock limit and its peak memory measured (they took 72 s and
8 GB, aborted train.py after 52 s, or printed 1,418-line tracebacks).

Hostile inputs: runs only in its own PID namespace, like test_sandbox_adversarial.py
(scripts/test.sh, step 3).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.launch.malformed import make_malformed
from tests.launch.malformed import run_case
from tests.models.hostile_templates import HOSTILE

pytestmark = pytest.mark.adversarial

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Every template of the red team's, and loops that would run for hours.
TEMPLATES = {case: template for case, template, _ in HOSTILE}
TEMPLATES["nested loops"] = ("{% for i in range(60000) %}{% for j in range(60000) %}"
                             "{{ i * j }}{% endfor %}{% endfor %}")
TEMPLATES["nested loops, no output"] = ("{% for i in range(60000) %}{% for j in range(60000) %}"
                                        "{% endfor %}{% endfor %}")
RENDER_ALL = textwrap.dedent("""
    import json, resource, sys, time
    from rlhf_jax.models.chat_template import ChatTemplateError, render_chat
    for case, template in json.loads(sys.argv[1]).items():
      start = time.perf_counter()
      try:
        render_chat(template, [{"role": "user", "content": "hi"}], timeout_s=2.0)
        outcome = "rendered"
      except ChatTemplateError as error:
        outcome = str(error)
      print(json.dumps({"case": case, "outcome": outcome,
                        "seconds": time.perf_counter() - start,
                        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
            flush=True)
""")


def test_hostile_templates_end_in_one_line_within_their_bounds():
  result = subprocess.run([sys.executable, "-c", RENDER_ALL, json.dumps(TEMPLATES)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(line) for line in result.stdout.splitlines()]
  assert [r["case"] for r in records] == list(TEMPLATES)
  for record in records:
    assert record["outcome"].startswith("the chat template "), record
    assert "\n" not in record["outcome"], record
    assert record["seconds"] < 3.0, record  # a 2 s deadline, or refused at once
  assert max(r["peak_mb"] for r in records) < 2048, records  # the child's whole peak
  assert not result.stderr.strip(), result.stderr[-3000:]


def test_a_50_megabyte_row_is_one_line_before_it_is_rendered(tmp_path):
  make_malformed(tmp_path / "files")
  result, seconds = run_case(
      "train.py", ("--config=configs/grpo.py:hf", "--config.model.checkpoint={d}/ckpt",
                   "--config.data.train_file={d}/big_row.jsonl", "--validate_only",
                   "--config.data.eval_file={d}/good.jsonl", "--workdir={w}"),
      tmp_path / "files", tmp_path / "work", timeout=120)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
  assert "big_row.jsonl:2: the prompt has 50000002 characters" in lines[0]
  assert seconds < 60
