"""Prompts as the model expects them (data/prompts.py): chat-list rows rendered with the
tokenizer's template exactly as transformers renders and tokenises them (system and
earlier turns kept), the three `data.chat_template` modes, `data.system_prompt`, and
errors that name the row."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_jax import models
from rlhf_jax.data import Example
from rlhf_jax.data.prompts import PromptError
from rlhf_jax.data.prompts import PromptFormat
from rlhf_jax.data.prompts import check_prompts
from rlhf_jax.data.sources import located_examples

# Qwen2.5-Instruct's template, shortened to the part without tools: a default system turn
# when the conversation has none.
TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
CORPUS = ["What is 2+3? Think step by step.", "You are a careful solver.", "six times seven"]


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("tok")
  tokenizer = models.train_bpe_tokenizer(CORPUS * 20, vocab_size=320)
  tokenizer.chat_template = TEMPLATE
  tokenizer.save(str(directory))
  return str(directory)


def transformers_ids(directory, messages):
  transformers = pytest.importorskip("transformers")
  reference = transformers.AutoTokenizer.from_pretrained(directory)
  text = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  ids = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
  ids = ids["input_ids"] if hasattr(ids, "keys") else ids
  return text, list(ids)


def test_a_verl_row_with_a_system_turn_reaches_the_model_as_transformers_renders_it(
    checkpoint_dir, tmp_path):
  messages = [{"role": "system", "content": "You are a careful solver."},
              {"role": "user", "content": "What is 2+3?"},
              {"role": "assistant", "content": "six"},
              {"role": "user", "content": "Think step by step."}]
  path = str(tmp_path / "verl.parquet")
  pq.write_table(pa.Table.from_pylist([{
      "data_source": "openai/gsm8k", "prompt": messages,
      "reward_model": {"style": "rule", "ground_truth": "5"}}]), path)
  ((where, example),) = located_examples(path, columns={
      "answer": "reward_model.ground_truth", "task": "data_source"})
  prompts = PromptFormat(models.Tokenizer.from_directory(checkpoint_dir), prompt_length=256)
  text, ids = transformers_ids(checkpoint_dir, messages)
  assert prompts.text(example) == text
  assert prompts.encode(example, where) == ids
  assert text.startswith("<|im_start|>system\nYou are a careful solver.") and text.endswith(
      "<|im_start|>assistant\n")
  assert check_prompts(prompts, [(where, example)]) == len(ids)


@pytest.mark.parametrize("mode, system, expected", [
    ("auto", "", "Hi"),  # a plain string stays raw text (TRL's rule)
    ("always", "", "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"
                   "\n<|im_start|>assistant\n"),
    ("always", "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                            "<|im_end|>\n<|im_start|>assistant\n"),
    ("never", "Be brief.", "Hi"),
])
def test_the_modes_for_a_plain_string_prompt(checkpoint_dir, mode, system, expected):
  tokenizer = models.Tokenizer.from_directory(checkpoint_dir)
  prompts = PromptFormat(tokenizer, chat_template=mode, system_prompt=system)
  assert prompts.text(Example("Hi", "1", "t")) == expected
  if mode == "always":
    turns = [{"role": "system", "content": system}] if system else []
    assert prompts.text(Example("Hi", "1", "t")) == transformers_ids(
        checkpoint_dir, turns + [{"role": "user", "content": "Hi"}])[0]


def test_system_prompt_is_added_only_to_rows_without_one(checkpoint_dir):
  tokenizer = models.Tokenizer.from_directory(checkpoint_dir)
  prompts = PromptFormat(tokenizer, system_prompt="Be brief.")
  own = Example("q", "1", "t", messages=[{"role": "system", "content": "Mine."},
                                         {"role": "user", "content": "q"}])
  assert prompts.messages(own)[0]["content"] == "Mine."
  bare = Example("q", "1", "t", messages=[{"role": "user", "content": "q"}])
  assert prompts.messages(bare)[0] == {"role": "system", "content": "Be brief."}
  # 'never' gives the last user turn, without template or system turn
  assert PromptFormat(tokenizer, chat_template="never").text(own) == "q"


def test_a_chat_row_without_a_template_is_an_error_naming_the_row():
  tokenizer = models.build_character_tokenizer("abc")  # no template of its own
  chat = Example("a", "1", "t", messages=[{"role": "user", "content": "a"}])
  with pytest.raises(PromptError, match=r"f.jsonl:3: a chat prompt, but the tokenizer has no "
                                        r"chat template"):
    PromptFormat(tokenizer).encode(chat, "f.jsonl:3")
  assert PromptFormat(tokenizer, chat_template="never").encode(chat) == tokenizer.encode("a")


def test_too_long_and_unencodable_prompts_name_the_row():
  tokenizer = models.build_character_tokenizer("abc")
  prompts = PromptFormat(tokenizer, prefix=[1], prompt_length=3)
  assert prompts.encode(Example("ab", "1", "t")) == [1] + tokenizer.encode("ab")
  with pytest.raises(PromptError, match=r"f.jsonl:2: the prompt has 4 tokens, more than "
                                        r"data.prompt_length=3"):
    check_prompts(prompts, [("f.jsonl:1", Example("a", "1", "t")),
                            ("f.jsonl:2", Example("abc", "1", "t"))])
  with pytest.raises(PromptError, match=r"f.jsonl:1: the tokenizer cannot encode the prompt"):
    prompts.encode(Example("z", "1", "t"), "f.jsonl:1")


def test_a_judge_reads_a_chat_prompt_as_plain_turns():
  from rlhf_jax.data.prompts import conversation_text
  chat = Example("q", "1", "t", messages=[{"role": "system", "content": "Be terse."},
                                          {"role": "user", "content": "2+2?"}])
  assert conversation_text(chat) == "system: Be terse.\n\nuser: 2+2?\n"
  assert conversation_text(Example("2+2?\n", "4", "arith")) == "2+2?\n"
  from rlhf_jax.rewards import genrm
  question = genrm.judge_question(genrm.GT_TEMPLATE, chat, "4")
  assert question.startswith("system: Be terse.\n\nuser: 2+2?\nReference answer: 1")


def test_a_system_prompt_that_would_not_reach_a_row_is_an_error(checkpoint_dir):
  tokenizer = models.Tokenizer.from_directory(checkpoint_dir)
  chat = Example("q", "1", "t", messages=[{"role": "user", "content": "q"}])
  rows = [("f.jsonl:1", chat), ("f.jsonl:2", Example("plain", "1", "t"))]
  with pytest.raises(PromptError, match=r"f.jsonl:2: a plain-text prompt, which "
                                        r"data.system_prompt does not reach"):
    check_prompts(PromptFormat(tokenizer, system_prompt="Be brief."), rows)
  assert check_prompts(PromptFormat(tokenizer, chat_template="always",
                                    system_prompt="Be brief."), rows) > 0
