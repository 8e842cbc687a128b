"""The tokenizer wrapper, with tokenizers built locally, against transformers' own loader."""

import numpy as np
import pytest

from rlhf_jax.models import tokenizer as tokenizer_lib

ARITH = "0123456789+-*=() ?.\nabcdefghijklmnopqrstuvwxyzAnswer:"
CORPUS = [f"What is {a} plus {b}? The answer is {a + b}.\nAnswer: {a + b}"
          for a in range(0, 300, 7) for b in range(0, 90, 11)]


@pytest.fixture(scope="module")
def char_tokenizer():
  return tokenizer_lib.build_character_tokenizer(ARITH)


@pytest.fixture(scope="module")
def bpe_tokenizer():
  return tokenizer_lib.train_bpe_tokenizer(CORPUS, vocab_size=300)


def test_character_tokenizer_ids_and_round_trip(char_tokenizer):
  assert [char_tokenizer.backend.token_to_id(t) for t in tokenizer_lib.CHATML_SPECIAL_TOKENS] == [
      0, 1, 2]
  assert char_tokenizer.eos_id == 0 and char_tokenizer.pad_id == 0
  text = "12+30=42\nAnswer: 42"
  ids = char_tokenizer.encode(text)
  assert len(ids) == len(text)  # one token per character
  assert char_tokenizer.decode(ids) == text
  assert char_tokenizer.decode(ids + [char_tokenizer.eos_id]) == text
  assert char_tokenizer.decode(ids + [0], skip_special_tokens=False) == text + "<|endoftext|>"
  assert char_tokenizer.truncate_at_eos(ids[:3] + [0, 5, 6]) == ids[:3] + [0]


def test_unknown_character_is_an_error(char_tokenizer):
  with pytest.raises(Exception):
    char_tokenizer.encode("12 % 5")


def test_pad_left_right_and_truncation(char_tokenizer):
  sequences = [[5, 6, 7], [8], []]
  ids, mask = char_tokenizer.pad(sequences, side="left")
  np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 8], [0, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 0, 0]])
  ids, mask = char_tokenizer.pad(sequences, side="right", length=4)
  np.testing.assert_array_equal(ids, [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]])
  assert ids.dtype == np.int32 and mask.dtype == np.int32
  with pytest.raises(ValueError, match="sequence 0 has 3 tokens, more than length=2"):
    char_tokenizer.pad(sequences, length=2)
  ids, _ = char_tokenizer.pad(sequences, length=2, truncation="left")
  np.testing.assert_array_equal(ids[0], [6, 7])
  with pytest.raises(ValueError, match="side='middle'"):
    char_tokenizer.pad(sequences, side="middle")


def test_bad_special_token_is_named():
  backend = tokenizer_lib.build_character_tokenizer("ab").backend
  with pytest.raises(ValueError, match="eos_token='</s>' is not in the tokenizer's vocabulary"):
    tokenizer_lib.Tokenizer(backend, eos_token="</s>")


def test_saved_tokenizer_matches_transformers(bpe_tokenizer, tmp_path):
  transformers = pytest.importorskip("transformers")
  bpe_tokenizer.save(str(tmp_path))
  ours = tokenizer_lib.Tokenizer.from_directory(str(tmp_path))
  hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  texts = ["What is 123 plus 45?", "The answer is 168.\nAnswer: 168", "  spaces  and 7 digits 0"]
  assert ours.encode_batch(texts) == [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
  for ids in ours.encode_batch(texts):
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
  assert hf.eos_token_id == ours.eos_id and hf.pad_token_id == ours.pad_id
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
  assert ours.apply_chat_template(messages) == hf.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True)
  # Every digit is its own token (the Qwen2 convention the arithmetic task relies on).
  assert all(len(ours.decode([i])) == 1 for i in ours.encode("9876543210"))


def test_chat_template_errors(char_tokenizer):
  with pytest.raises(ValueError, match=r"messages\[0\] must have exactly the keys"):
    char_tokenizer.apply_chat_template([{"role": "user", "text": "hi"}])
  no_chat = tokenizer_lib.build_character_tokenizer("ab", special_tokens=("<eos>",))
  with pytest.raises(ValueError, match="chat template token='<\\|im_start\\|>'"):
    no_chat.apply_chat_template([{"role": "user", "content": "ab"}])


def test_character_tokenizer_keeps_every_newline_of_a_run():
  tokenizer = tokenizer_lib.build_character_tokenizer("ab\n")
  ids = tokenizer.encode("a\n\n\nb")
  assert len(ids) == 5 and tokenizer.decode(ids) == "a\n\n\nb"
