"""One file record → `Example` (data/example.py), field by field as the module docstring's
schema says: column mappings by dotted path, chat prompts, the record's other columns kept
in metadata, GSM8K's and MATH's answer formats, and errors that name the row and field."""

from __future__ import annotations

import math

import pytest

from rlhf_jax.data.example import Example
from rlhf_jax.data.example import is_chat
from rlhf_jax.data.example import record_to_example
from rlhf_jax.data.example import reference_of
from rlhf_jax.data.example import to_record

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"}, {"role": "user", "content": "and 2+2?"}]


def test_a_plain_record_and_its_round_trip():
  example = record_to_example({"prompt": "1+1?", "answer": 2, "task": "arith",
                               "metadata": {"level": 1}}, "f:1")
  assert example == Example("1+1?", "2", "arith", {"level": 1})  # a number becomes text
  assert record_to_example(to_record(example), "f:2") == example
  assert "messages" not in to_record(example)


def test_mapped_columns_a_chat_prompt_and_the_other_columns_in_metadata():
  record = {"question": CHAT, "reward_model": {"ground_truth": "4"}, "data_source": "gsm",
            "solution": "2+2=4", "blob": object()}
  example = record_to_example(record, "f:3", {"prompt": "question",
                                              "answer": "reward_model.ground_truth",
                                              "task": "data_source"},
                              task_aliases={"gsm": "math"})
  assert example.prompt == "and 2+2?"  # the last user turn
  assert example.messages == tuple(CHAT) and example.answer == "4" and example.task == "math"
  # The flat columns stay under their names (the task's source too); not the prompt's,
  # not a nested answer's source, not what has no JSON form.
  assert example.metadata == {"data_source": "gsm", "solution": "2+2=4"}
  assert record_to_example(to_record(example), "f:4") == example


def test_metadata_as_json_text_and_a_default_task():
  example = record_to_example({"prompt": "p", "answer": "a", "metadata": '{"k": [1, 2]}'},
                              "f:5", default_task="x")
  assert example.task == "x" and example.metadata == {"k": [1, 2]}


@pytest.mark.parametrize("answer, answer_format, reference", [
    ("anything #### 7", "as_is", "anything #### 7"),
    ("Natalia sold 48/2 = 24 clips.\n#### 1,072", "gsm8k", "1072"),
    ("so \\boxed{\\frac{1}{2}} then \\boxed{x^{2}}.", "boxed", "x^{2}"),
])
def test_answer_formats(answer, answer_format, reference):
  assert reference_of(answer, answer_format, "f:1") == reference


@pytest.mark.parametrize("record, kwargs, message", [
    ([1], {}, r"^f:9: expected an object, got list"),
    ({"prompt": "p", "answer": "a"}, {}, r"^f:9: field 'task': no column 'task'"),
    ({"prompt": "p", "task": "t"}, {}, r"^f:9: field 'answer': no column 'answer'"),
    ({"prompt": 3, "answer": "a", "task": "t"}, {}, r"^f:9: field 'prompt' must be a string"),
    ({"prompt": "p", "answer": math.nan, "task": "t"}, {}, r"^f:9: field 'answer' is nan"),
    ({"prompt": [{"role": "system", "content": "s"}], "answer": "a", "task": "t"}, {},
     r"^f:9: field 'prompt' is a chat list without a user turn"),
    ({"prompt": "p", "answer": "a", "task": "t", "extra": 1}, {"strict": True},
     r"^f:9: unknown fields \['extra'\]"),
    ({"prompt": "p", "answer": "a", "task": "t", "metadata": "{"}, {},
     r"^f:9: field 'metadata' is text but not JSON"),
    ({"prompt": "p", "answer": "a", "task": "t", "messages": [{"role": 1}]}, {},
     r"^f:9: field 'messages' must be a list"),
    ({"q": {"x": 1}, "answer": "a", "task": "t"}, {"columns": {"prompt": "q.y"}},
     r"^f:9: field 'prompt': no column 'q\.y' \(path 'q\.y'\); there: \['x'\]"),
    ({"prompt": "p", "answer": "no marker", "task": "t"}, {"answer_format": "gsm8k"},
     r"^f:9: field 'answer' has no '#### N' line"),
    ({"prompt": "p", "answer": "a", "task": "t"}, {"columns": {"question": "q"}},
     r"column mapping names unknown fields \['question'\]"),
])
def test_errors_name_the_row_and_field(record, kwargs, message):
  with pytest.raises(ValueError, match=message):
    record_to_example(record, "f:9", **kwargs)


def test_is_chat_wants_role_and_content_strings():
  assert is_chat(CHAT) and is_chat([]) and not is_chat("text")
  assert not is_chat([{"role": "user", "content": None}])
