"""The commands printed in docs/byo.md, docs/agents.md and docs/extending.md run on two CPU
cores as printed: each is sized for a CPU (the arith variant, or an hf preset with the cpu
overlay), and each runs here in-process with its own flags, its placeholders filled in
(a transformers-saved Qwen3 checkpoint for DIR, TRL files, the docs' own reward function
and environment) and only the step counts shrunk."""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

from absl import flags
from ml_collections import config_flags
import pytest

from rlhf_jax import cli
from rlhf_jax import models
from rlhf_jax import training
from rlhf_jax.training import stages
from tests.launch.runs import ROOT
from tests.launch.runs import SMALL
from tests.models.hf_fixtures import save_family_model

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
DOCS = ("byo.md", "agents.md", "extending.md")
# Shrunk for CI; every other flag is the docs'.
FEWER_STEPS = {"sft.py": ["--config.sft.steps=2"],
               "train.py": ["--config.train.steps=1", "--config.sampler.warmup=False"]}


def doc_commands() -> list[tuple[str, str]]:
  """(doc, command) for every `python launch/...` line of the docs' bash blocks."""
  out = []
  for name in DOCS:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
      for line in block.replace("\\\n", " ").splitlines():
        if line.strip().startswith("python launch/"):
          out.append((name, " ".join(line.split())))
  return out


def test_every_training_command_is_sized_for_a_cpu():
  """eval.py's published-benchmark command keeps the papers' response length (a GPU job);
  its flags and files are checked below (--validate_only)."""
  commands = [(doc, c) for doc, c in doc_commands() if "launch/eval.py" not in c]
  assert {doc for doc, _ in commands} >= {"byo.md", "agents.md"}
  for doc, command in commands:
    preset = re.search(r"--config=(\S+)", command)[1]
    assert preset.endswith((":arith", ",cpu")), (doc, command)


def parse(argv: list[str]):
  """(config, workdir) of a launcher's flags, parsed as the launcher parses them."""
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "preset", flag_values=values,
                                           lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  cli.parse_flags(argv, values)
  return holder.value, values.workdir


def write_inputs(directory: pathlib.Path) -> dict[str, str]:
  """The files the docs' placeholders stand for; returns {placeholder: replacement}."""
  tokenizer = models.train_bpe_tokenizer(
      ["What colour is the sky? blue. Name a fruit: apple."] * 20, vocab_size=200)
  tokenizer.chat_template = (
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
      "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
  checkpoint = directory / "qwen3"
  tokenizer.save(str(checkpoint))
  save_family_model(checkpoint, "qwen3", vocab_size=tokenizer.vocab_size,
                    eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
  question = [{"role": "user", "content": "What colour is the sky?"}]
  (directory / "conversations.jsonl").write_text(json.dumps(
      {"messages": question + [{"role": "assistant", "content": "blue"}]}) + "\n")
  (directory / "prompts.jsonl").write_text(
      "".join(json.dumps({"prompt": question, "solution": "blue"}) + "\n" for _ in range(8)))
  (directory / "my_rewards.py").write_text(textwrap.dedent("""\
      def reward(prompts, completions, completion_ids, solution, **columns):
        return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]
      """))
  # docs/agents.md's own Calculator, as the page prints it
  agents = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
  (directory / "my_package").mkdir()
  (directory / "my_package" / "__init__.py").write_text("")
  (directory / "my_package" / "envs.py").write_text(
      re.search(r"```python\n(from rlhf_jax.envs import StepResult.*?)```", agents,
                re.DOTALL)[1])
  (directory / "math500.jsonl").write_text(json.dumps(
      {"problem": "What is 1 + 1?", "solution": "\\boxed{2}", "answer": "2"}) + "\n")
  # in order; relative files are read from `directory`, where the test runs
  return {"DIR": str(checkpoint), "/tmp/run/policy": str(checkpoint), "/tmp/": f"{directory}/"}


def run_command(command: str, directory: pathlib.Path) -> None:
  """One doc command, in-process (eval.py: its checks, in a process of its own)."""
  argv = shlex.split(command)[1:]  # launch/<script> and its flags
  script = pathlib.Path(argv[0]).name
  spec = re.search(r"--config=(\S+)", command)[1]
  argv = [argv[0]] + [a.replace(f"--config={spec}", f"--config={ROOT / spec}") for a in argv[1:]]
  if script == "eval.py":  # a published benchmark at full length: its checks only
    result = subprocess.run([sys.executable, str(ROOT / argv[0]), *argv[1:], "--validate_only"],
                            cwd=directory, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "config ok" in result.stdout, result.stderr[-2000:]
    return
  argv += FEWER_STEPS.get(script, [])
  if ":arith" in spec:  # the arith warm start at test size
    argv += SMALL + ["--config.train.steps=1"]
  config, workdir = parse(argv)
  lines = []
  if script == "sft.py":
    result = stages.warm_start(config, workdir, log=lines.append)
    assert pathlib.Path(result["checkpoint"], "config.json").exists()
  elif ":arith" in spec:  # a warm start and episodes take minutes: the run's checks only
    assert training.run(config, workdir, validate_only=True, log=lines.append) is None
    assert lines == ["config ok"]
  else:
    summary = training.run(config, workdir, progress=False, log=lines.append)
    assert summary["steps"] == 1, lines


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted({doc for doc, _ in doc_commands()}))
def test_the_doc_commands_run_in_order(doc, tmp_path, monkeypatch):
  replacements = write_inputs(tmp_path)
  monkeypatch.chdir(tmp_path)  # the docs' modules (my_rewards, my_package) are here
  monkeypatch.syspath_prepend(str(tmp_path))
  for name, command in doc_commands():
    if name == doc:
      pattern = "|".join(map(re.escape, replacements))  # one pass: values hold "/tmp/"
      run_command(re.sub(pattern, lambda m: replacements[m[0]], command), tmp_path)
