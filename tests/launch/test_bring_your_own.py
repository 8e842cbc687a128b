"""Your model, your data, your reward, end to end as a new user runs them (fresh
processes, flags only): a Qwen3 checkpoint saved by transformers with a chat template, a
TRL conversational JSONL with a task the library has never heard of, and a reward
function of one's own in TRL's signature."""

import json

import pytest

from tests.launch.byo_files import MESSAGES
from tests.launch.byo_files import TINY
from tests.launch.byo_files import family_checkpoint
from tests.launch.byo_files import trl_file
from tests.launch.runs import run


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return family_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.mark.slow
def test_trl_conversational_data_and_a_trl_reward_function_on_a_qwen3_checkpoint(
    tmp_path, checkpoint):
  data = trl_file(tmp_path / "colours.jsonl",
                  [{"prompt": MESSAGES, "solution": colour} for colour in ("red", "blue")] * 2)
  flags = ["--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'run'}",
           f"--config.model.checkpoint={checkpoint}", f"--config.data.train_file={data}",
           f"--config.data.eval_file={data}", "--config.data.columns=answer=solution",
           "--config.data.default_task=colours",
           "--config.reward.function=tests.rewards.reward_fns:solution_match", *TINY]
  checked = run("train.py", *flags, "--validate_only")
  assert checked.returncode == 0 and checked.stdout.strip() == "config ok", checked.stderr
  # A row too long for data.prompt_length is named before anything loads.
  long = trl_file(tmp_path / "long.jsonl", [{"prompt": MESSAGES, "solution": "red"},
                                            {"prompt": "red " * 120, "solution": "red"}])
  refused = run("train.py", *flags, f"--config.data.train_file={long}", "--validate_only")
  assert refused.returncode == 2, refused.stderr
  assert refused.stderr.strip().splitlines()[-1].startswith(
      f"error: config.data.train_file: {long}:2: the prompt has ")

  result = run("train.py", *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])["steps"] == 2
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
          .splitlines()]
  steps = [r for r in rows if "reward_mean" in r]
  assert len(steps) == 2 and all("reward/solution_match/mean" in r for r in steps)
  # The model was given the chat template's rendering, token for token as transformers has it.
  transformers = pytest.importorskip("transformers")
  reference = transformers.AutoTokenizer.from_pretrained(checkpoint)
  expected = reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
  expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
  logged = json.loads((tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()[0])
  prompt = logged["token_ids"][:logged["loss_mask"].index(1)]
  assert prompt == expected
  # The trained policy keeps the checkpoint's tokenizer and template: transformers renders
  # the same chat from it as from the original.
  policy = json.loads(result.stdout.strip().splitlines()[-1])["policy"]
  exported = transformers.AutoTokenizer.from_pretrained(policy)
  assert exported.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == (
      reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False))


def test_a_family_that_cannot_load_is_refused_by_validate_only(tmp_path, checkpoint):
  import shutil
  moe = tmp_path / "moe"
  shutil.copytree(checkpoint, moe)
  config = json.loads((moe / "config.json").read_text())
  config.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4)
  (moe / "config.json").write_text(json.dumps(config))
  data = trl_file(tmp_path / "d.jsonl", [{"prompt": MESSAGES, "solution": "red"}])
  result = run("train.py", "--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'run'}",
               f"--config.model.checkpoint={moe}", f"--config.data.train_file={data}",
               "--config.data.columns=answer=solution", "--config.data.default_task=colours",
               "--config.reward.function=tests.rewards.reward_fns:solution_match", *TINY,
               "--validate_only")
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines() == [
      f"error: config.model.checkpoint: {moe}: config.json: MixtralForCausalLM is a "
      "mixture-of-experts model we do not have; supported: Qwen3MoeForCausalLM, "
      "GptOssForCausalLM."]


@pytest.mark.slow
def test_a_gemma3_checkpoint_trains_from_the_launcher(tmp_path):
  checkpoint = family_checkpoint(tmp_path / "gemma3", "gemma3_text")
  data = trl_file(tmp_path / "colours.jsonl",
                  [{"prompt": MESSAGES, "solution": colour} for colour in ("red", "blue")])
  result = run("train.py", "--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'run'}",
               f"--config.model.checkpoint={checkpoint}", f"--config.data.train_file={data}",
               "--config.data.columns=answer=solution", "--config.data.default_task=colours",
               "--config.reward.function=tests.rewards.reward_fns:solution_match", *TINY,
               "--config.train.steps=1", "--config.train.log_rollouts=0")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["steps"] == 1
  transformers = pytest.importorskip("transformers")
  exported = transformers.AutoModelForCausalLM.from_pretrained(summary["policy"])
  assert type(exported).__name__ == "Gemma3ForCausalLM"


@pytest.mark.slow
@pytest.mark.parametrize("family, cls", [("qwen3_moe", "Qwen3MoeForCausalLM"),
                                         ("gpt_oss", "GptOssForCausalLM")])
def test_a_moe_checkpoint_trains_from_the_launcher_with_routing_replay(tmp_path, family, cls):
  """R3: the sampler records routes, the batch carries them, the packed forwards replay;
  the exported policy loads and generates in transformers."""
  checkpoint = family_checkpoint(tmp_path / family, family)
  data = trl_file(tmp_path / "colours.jsonl",
                  [{"prompt": MESSAGES, "solution": colour} for colour in ("red", "blue")])
  result = run("train.py", "--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'run'}",
               f"--config.model.checkpoint={checkpoint}", f"--config.data.train_file={data}",
               "--config.data.columns=answer=solution", "--config.data.default_task=colours",
               "--config.reward.function=tests.rewards.reward_fns:solution_match", *TINY,
               "--config.train.steps=1", "--config.train.log_rollouts=0",
               "--config.algorithm.moe.routing_replay=R3",
               "--config.algorithm.correction.reuse_sampler_logprobs=False")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["steps"] == 1
  transformers = pytest.importorskip("transformers")
  exported = transformers.AutoModelForCausalLM.from_pretrained(summary["policy"])
  assert type(exported).__name__ == cls
  assert exported.config.num_experts == 4
  prompt = transformers.AutoTokenizer.from_pretrained(summary["policy"])(
      "Name a colour.", return_tensors="pt")
  generated = exported.generate(**prompt, max_new_tokens=3, do_sample=False)
  assert generated.shape[1] == prompt["input_ids"].shape[1] + 3


@pytest.mark.slow
def test_a_reward_function_that_raises_is_shown_and_stops_the_run(tmp_path, checkpoint):
  data = trl_file(tmp_path / "colours.jsonl",
                  [{"prompt": MESSAGES, "solution": colour} for colour in ("red", "blue")])
  result = run("train.py", "--config=configs/grpo.py:hf", f"--workdir={tmp_path / 'run'}",
               f"--config.model.checkpoint={checkpoint}", f"--config.data.train_file={data}",
               "--config.data.columns=answer=solution", "--config.data.default_task=colours",
               "--config.reward.function=tests.rewards.reward_fns:raises",
               "--config.reward.max_failed_steps=2", *TINY, "--config.train.steps=3")
  assert result.returncode == 1, result.stderr[-3000:]
  said = result.stdout + result.stderr
  # each step: the function, the count and the first reason, on the console
  assert "reward function raises failed on 4 of 4 samples: raised RuntimeError: boom" in said
  assert ("stopped before step 2: every sample's reward failed in 2 steps in a row "
          "(reward.max_failed_steps=2); the first reason: reward.function raises: raised "
          "RuntimeError: boom") in said, said[-3000:]
  records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text()
             .splitlines()]
  assert records and all(r["failure"] == "reward.function raises: raised RuntimeError: boom"
                         for r in records)
  metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
  assert metrics["reward_failures"] == 4 and metrics["reward/raises/failures"] == 4
