"""Tiny tokenizer directories in the layout of published checkpoints (no downloads): a
byte-level BPE trained here with the family's pre-tokenizer and special tokens, the
family's tokenizer_config.json keys, and a published chat template from templates/."""

import hashlib
import json
import pathlib

TEMPLATES = pathlib.Path(__file__).parent / "templates"
# Checked before use: the files must stay the published texts (templates/README.md).
SHA256 = {
    "qwen2_5_instruct": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "llama3_instruct": "ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122",
    "llama3_1_instruct": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
}
# transformers' Qwen2Tokenizer builds its own pipeline (NFC, this split, byte level) around
# tokenizer.json's vocabulary, so the fixture's tokenizer.json uses the same one.
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
              r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"""
                r"""[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
CORPUS = ["What is the temperature in Paris, France right now?",
          "The current temperature is 22.5 degrees. Let me check the weather for you.",
          "def add(a, b):\n    return a + b\n", "You are a helpful assistant. Think step by step.",
          '{"name": "get_current_temperature", "arguments": {"location": "Paris, France"}}'] * 8
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
              "</think>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


def template(name: str) -> str:
  """A published template's text, checked against its recorded SHA-256."""
  data = (TEMPLATES / f"{name}.jinja").read_bytes()
  digest = hashlib.sha256(data).hexdigest()
  if digest != SHA256[name]:
    raise AssertionError(f"templates/{name}.jinja was edited (sha256 {digest}).")
  return data.decode("utf-8")


def train_backend(family: str):
  """A byte-level BPE `tokenizers.Tokenizer` with the family's pipeline and tokens."""
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
  from tokenizers import processors, trainers

  qwen = family == "qwen"
  backend = Tokenizer(models.BPE())
  if qwen:
    backend.normalizer = normalizers.NFC()
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN_SPLIT if qwen else LLAMA3_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  backend.decoder = decoders.ByteLevel()
  special = QWEN_SPECIAL if qwen else LLAMA_SPECIAL
  trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=special, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  backend.train_from_iterator(CORPUS, trainer=trainer)
  if qwen:
    backend.add_tokens(QWEN_ADDED)  # not special, as in Qwen2.5 and Qwen3
  else:  # Llama 3's tokenizer.json adds the BOS when asked for special tokens
    bos = "<|begin_of_text|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, backend.token_to_id(bos))])
  return backend


def _added_tokens_decoder(backend) -> dict:
  return {str(i): {"content": t.content, "lstrip": False, "normalized": not t.special,
                   "rstrip": False, "single_word": False, "special": t.special}
          for i, t in sorted(backend.get_added_tokens_decoder().items())}


def write_checkpoint(directory, name: str, *, template_in: str = "config") -> pathlib.Path:
  """A tokenizer directory for published template `name`, with that checkpoint's
  tokenizer_config.json keys; the template in the config or in chat_template.jinja."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  qwen = name.startswith("qwen")
  backend = train_backend("qwen" if qwen else "llama")
  backend.save(str(directory / "tokenizer.json"))
  if qwen:
    config = {"add_bos_token": False, "add_prefix_space": False,
              "additional_special_tokens": QWEN_SPECIAL[1:], "bos_token": None,
              "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
              "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
              "unk_token": None}
  else:
    config = {"bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True,
              "eos_token": "<|eot_id|>", "model_input_names": ["input_ids", "attention_mask"],
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
  config["added_tokens_decoder"] = _added_tokens_decoder(backend)
  if template_in == "config":
    config["chat_template"] = template(name)
  else:
    (directory / "chat_template.jinja").write_bytes(template(name).encode("utf-8"))
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
  return directory


def assert_parity(ours, reference, messages, **kwargs):
  """Our text and ids == transformers' (`apply_chat_template`, tokenize False and True)."""
  text = ours.apply_chat_template(messages, **kwargs)
  expected = reference.apply_chat_template(messages, tokenize=False, **kwargs)
  assert text == expected
  ids = reference.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
  assert ours.encode(text) == list(ids)
  return text, list(ids)
