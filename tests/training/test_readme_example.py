"""The README's Python example runs as written: its preset, fields and `training.run`
exist and the config validates (with `validate_only`, so no training happens here)."""

from __future__ import annotations

import pathlib
import re

from rlhf_jax import training

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_readme_python_example_validates(monkeypatch, tmp_path, capsys):
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
  assert len(blocks) == 1, "the README has one Python example"
  code = blocks[0]
  assert "training.run(config" in code and len(code.strip().splitlines()) <= 10
  real_run = training.run
  calls = []

  def validate_only(config, workdir, **kwargs):
    calls.append(workdir)
    real_run(config, str(tmp_path / "run"), validate_only=True, **kwargs)
    return {"eval_accuracy_start": 0.0, "eval_accuracy_end": 0.0}

  monkeypatch.setattr(training, "run", validate_only)
  monkeypatch.chdir(ROOT)
  exec(compile(code, "README.md", "exec"), {})  # pylint: disable=exec-used
  assert calls == ["/tmp/grpo_notebook"]
  assert "config ok" in capsys.readouterr().out
