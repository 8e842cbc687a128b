"""Other libraries' data read as they are, each with the `data.*` line docs/byo.md gives:
TRL's conversational and standard layouts, OpenRLHF's input/label JSONL, GSM8K's
question/answer with "#### N", MATH's boxed solutions and verl's Parquet; and the
one-line errors of rows the run cannot score."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import config as data_config_lib
from rlhf_jax.data import read_examples
from rlhf_jax.training import inputs
from rlhf_jax.training.config import base_config


def jsonl(path, *records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def read(path, **fields):
  """read_examples with the options a config's data section gives."""
  c = base_config("hf")
  for key, value in fields.items():
    c.data[key] = value
  data_config_lib.validate_data_fields(c.data)
  return read_examples(path, **data_config_lib.read_options(c.data))


def test_trl_conversational(tmp_path):
  # TRL's conversational prompt-only layout with a `solution` column (its GRPO examples)
  path = jsonl(tmp_path / "trl.jsonl",
               {"prompt": [{"role": "system", "content": "Reason."},
                           {"role": "user", "content": "1+1?"}], "solution": "2"})
  (example,) = read(path, columns="answer=solution", default_task="math")
  assert (example.prompt, example.answer, example.task) == ("1+1?", "2", "math")
  assert example.messages[0] == {"role": "system", "content": "Reason."}
  assert example.metadata == {"solution": "2"}  # a TRL reward function reads it by name


def test_trl_standard_without_a_reference(tmp_path):
  path = jsonl(tmp_path / "std.jsonl", {"prompt": "Write a haiku.", "style": "short"})
  (example,) = read(path, columns="answer=", default_task="haiku")
  assert (example.prompt, example.answer, example.task, example.messages) == (
      "Write a haiku.", "", "haiku", None)
  assert example.metadata == {"style": "short"}


def test_openrlhf_input_label(tmp_path):
  path = jsonl(tmp_path / "orl.jsonl", {"input": "3*4?", "label": "12"})
  (example,) = read(path, columns="prompt=input,answer=label", default_task="math")
  assert (example.prompt, example.answer, example.task) == ("3*4?", "12", "math")


def test_gsm8k_reference_is_the_number_after_the_marks(tmp_path):
  path = jsonl(tmp_path / "gsm8k.jsonl",
               {"question": "Ann has 3 boxes of 400 pens...",
                "answer": "3 boxes × 400 = <<3*400=1200>>1200\n#### 1,200"})
  (example,) = read(path, columns="prompt=question", default_task="math",
                    answer_format="gsm8k")
  assert example.answer == "1200"
  bad = jsonl(tmp_path / "bad.jsonl", {"question": "q", "answer": "no marks"})
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'answer' has no '#### N' line"):
    read(bad, columns="prompt=question", default_task="math", answer_format="gsm8k")


def test_math_boxed_solution(tmp_path):
  path = jsonl(tmp_path / "math.jsonl", {"problem": "p", "solution": r"So $\boxed{\frac{1}{2}}$."})
  (example,) = read(path, columns="prompt=problem,answer=solution", default_task="math",
                    answer_format="boxed")
  assert example.answer == r"\frac{1}{2}"


def verl_file(tmp_path, source):
  path = str(tmp_path / f"{source.replace('/', '_')}.parquet")
  pq.write_table(pa.Table.from_pylist([{
      "data_source": source, "ability": "math",
      "prompt": [{"role": "user", "content": "6*7?"}],
      "reward_model": {"style": "rule", "ground_truth": "42"},
      "extra_info": {"split": "train", "index": 0}}]), path)
  return path


def hf_config(train_file, **data):
  c = base_config("hf")
  c.data.train_file = train_file
  c.data.columns = "answer=reward_model.ground_truth,task=data_source"
  for key, value in data.items():
    c.data[key] = value
  return c


@pytest.mark.parametrize("source, task", [("openai/gsm8k", "math"),
                                          ("DigitalLearningGmbH/MATH-lighteval", "math"),
                                          ("codecontests", "code")])
def test_verl_parquet_as_it_is_is_scored_by_the_matching_verifier(tmp_path, source, task):
  train, _ = inputs.load_examples(hf_config(verl_file(tmp_path, source)))
  assert [(e.task, e.answer, e.metadata["data_source"]) for e in train] == [
      (task, "42", source)]


def test_an_unknown_source_names_itself_and_the_ways_out(tmp_path):
  c = hf_config(verl_file(tmp_path, "my_org/puzzles"))
  with pytest.raises(ConfigError, match=r"config.data.train_file: .*my_org_puzzles.parquet: "
                                        r"row 0: no scorer for task 'my_org/puzzles' \(known: "
                                        r"arith, code, math, pycalc, toolcalc\); score it with "
                                        r"reward.function=.*task=ability for verl"):
    inputs.load_examples(c)
  c.data.columns = "answer=reward_model.ground_truth,task=ability"
  assert inputs.load_examples(c)[0][0].task == "math"


def test_a_missing_task_column_names_file_row_and_the_default_task_field(tmp_path):
  c = hf_config(jsonl(tmp_path / "t.jsonl", {"prompt": "q", "answer": "1"}), columns="")
  with pytest.raises(ConfigError, match=r"config.data.train_file: .*t.jsonl:1: field 'task': "
                                        r"no column 'task'"):
    inputs.load_examples(c)
  c.data.default_task = "math"
  assert inputs.load_examples(c)[0][0].task == "math"


def test_a_missing_answer_column_names_the_columns_there_and_the_way_out(tmp_path):
  path = jsonl(tmp_path / "trl.jsonl", {"prompt": "q", "solution": "1"})
  with pytest.raises(ValueError, match=r"trl.jsonl:1: field 'answer': no column 'answer'; "
                                       r"there: \['prompt', 'solution'\]; name the reference "
                                       r"column with data.columns='answer=<column>'"):
    read(path, default_task="math")
