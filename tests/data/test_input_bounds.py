"""Data files that cannot be read are one error naming the file and row, and a row too
long for `data.prompt_length` is refused before it is rendered or tokenised: undecodable
bytes and a torn multi-byte character, JSON nested past the parser, NaN / Infinity as
answers, a prompt of more characters than its tokens could hold."""

from __future__ import annotations

import json
import time

import pytest

from rlhf_jax.data import Example
from rlhf_jax.data.prompts import MAX_CHARS_PER_TOKEN
from rlhf_jax.data.prompts import PromptError
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.data.prompts import check_prompts
from rlhf_jax.data.sources import located_examples

ROW = {"prompt": "1+2=", "answer": "3", "task": "arith"}


def write_lines(path, lines: list[bytes]) -> str:
  path.write_bytes(b"\n".join(lines) + b"\n")
  return str(path)


@pytest.mark.parametrize("bad,message", [
    (json.dumps({**ROW, "prompt": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"),
     r"not UTF-8 text \(byte 16"),
    (json.dumps({**ROW, "prompt": "\u00e9"}, ensure_ascii=False).encode()[:13],
     "not UTF-8 text"),  # a multi-byte character torn in the middle
    (b"\xff\xfe" + json.dumps(ROW).encode("utf-16-le"), r"not UTF-8 text \(byte 1"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply"),
])
def test_an_unreadable_row_names_the_file_and_line(tmp_path, bad, message):
  path = write_lines(tmp_path / "d.jsonl", [json.dumps(ROW).encode(), bad,
                                            json.dumps(ROW).encode()])
  with pytest.raises(ValueError, match=f"^{path}:2: {message}"):
    located_examples(path)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_answer_is_refused_naming_the_row(tmp_path, literal):
  good = json.dumps(ROW).encode()
  bad = b'{"prompt": "1+2=", "task": "arith", "answer": ' + literal.encode() + b"}"
  path = write_lines(tmp_path / "d.jsonl", [good, good, bad])
  with pytest.raises(ValueError, match=f"^{path}:3: field 'answer' is "):
    located_examples(path)
  # a number that is finite is still read as its text, as before
  write_lines(tmp_path / "d.jsonl", [b'{"prompt": "1+2=", "task": "arith", "answer": 3.5}'])
  assert located_examples(path)[0][1].answer == "3.5"


class UntouchableTokenizer:
  """A tokenizer whose every use fails the test: a refused row must not reach it."""
  chat_template = "{{ messages }}"

  def encode(self, text):
    raise AssertionError(f"tokenised {len(text)} characters")

  def apply_chat_template(self, turns, **_):
    raise AssertionError("rendered")


@pytest.mark.parametrize("chat", [False, True])
def test_a_row_longer_than_its_tokens_can_hold_is_refused_before_rendering(chat):
  length = 64
  limit = length * MAX_CHARS_PER_TOKEN
  text = "x" * (limit - 100)
  messages = ({"role": "user", "content": text}, {"role": "assistant", "content": "y" * 101},
              {"role": "user", "content": "?"}) if chat else None
  long_row = Example(prompt=text + "y" * 101, answer="", task="t", messages=messages)
  prompts = PromptFormat(UntouchableTokenizer(), chat_template="auto", prompt_length=length)
  rows = [("d.jsonl:7", long_row)]
  with pytest.raises(PromptError, match=f"^d.jsonl:7: the prompt has {limit + 1 + chat} "
                                        f"characters, more than data.prompt_length={length} "
                                        f"tokens can hold .at most {MAX_CHARS_PER_TOKEN}"):
    check_prompts(prompts, rows)


def test_a_50_megabyte_row_is_refused_in_well_under_a_second():
  prompts = PromptFormat(UntouchableTokenizer(), chat_template="always", prompt_length=512,
                         system_prompt="Be brief.")
  start = time.thread_time()  # this thread's CPU seconds: other processes' load adds none
  with pytest.raises(PromptError, match="the prompt has 50000009 characters"):
    prompts.encode(Example(prompt="x" * 50_000_000, answer="", task="t"), "big.jsonl:1")
  assert time.thread_time() - start < 1.0


@pytest.mark.parametrize("record,characters", [
    ({"messages": [{"role": "user", "content": "x" * 3000},
                   {"role": "assistant", "content": "y" * 100}]}, 3100),
    ({"prompt": "x" * 3000, "completion": "y" * 200}, 3200),
    ({"prompt": [{"role": "user", "content": "x" * 3000}],
      "completion": [{"role": "assistant", "content": "y" * 97}]}, 3097),
])
def test_an_sft_row_is_bounded_in_characters_before_it_is_rendered(record, characters):
  from rlhf_jax.data.conversations import check_characters
  limit = (64 + 128) * MAX_CHARS_PER_TOKEN  # 3072
  with pytest.raises(ValueError, match=f"^s.jsonl:4: the row has {characters} characters, "
                                       r"more than data.prompt_length \+ sft.response_length "
                                       f"= 64 \\+ 128 tokens can hold .* {limit}"):
    check_characters(record, "s.jsonl:4", prompt_length=64, response_length=128)
  check_characters(record, "s.jsonl:4", prompt_length=64, response_length=128 + 10)
