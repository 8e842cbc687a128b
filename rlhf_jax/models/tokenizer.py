"""A thin wrapper over HF `tokenizers` (`tokenizer.json`): batch encode/decode, padding
into fixed-shape int32 arrays, EOS/PAD handling, and a ChatML chat template; plus two
small tokenizers built locally (character-level and byte-level BPE) for tests and demos.

Needs the `hf` extra (tokenizers).
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence

import numpy as np

from rlhf_jax.models.chat_template import render_chat
from rlhf_jax.models.chat_template import turn_suffix

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The Jinja form of `Tokenizer.apply_chat_template`, written to tokenizer_config.json so
# transformers renders the same string.
CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class Tokenizer:
  """Encode / decode / pad with special-token handling.

  Args (constructor):
    backend: a `tokenizers.Tokenizer`.
    eos_token: the end-of-sequence token (must be in the vocabulary).
    pad_token: the padding token (default: the EOS token, as Qwen2 does).
    chat_template: the Jinja chat template (tokenizer_config.json's), or None for the
      built-in ChatML (`CHATML_JINJA`).
  """

  def __init__(self, backend, *, eos_token: str = "<|endoftext|>",
               pad_token: str | None = None, chat_template: str | None = None):
    self.backend = backend
    self.chat_template = chat_template
    self.eos_token = eos_token
    self.pad_token = eos_token if pad_token is None else pad_token
    self.eos_id = self._id_of(self.eos_token, "eos_token")
    self.pad_id = self._id_of(self.pad_token, "pad_token")

  def _id_of(self, token: str, what: str) -> int:
    token_id = self.backend.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{what}={token!r} is not in the tokenizer's vocabulary.")
    return token_id

  # ------------------------------------------------------------------ loading

  @classmethod
  def from_directory(cls, directory: str) -> "Tokenizer":
    """Loads `tokenizer.json` (+ EOS, PAD and the chat template from
    `tokenizer_config.json` when present; of several named templates, "default")."""
    from tokenizers import Tokenizer as Backend  # the `hf` extra

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist.")
    settings = {}
    config_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.exists(config_path):
      with open(config_path) as f:
        settings = json.load(f)
    token_text = lambda t: t.get("content") if isinstance(t, dict) else t
    eos = token_text(settings.get("eos_token")) or CHATML_SPECIAL_TOKENS[0]
    pad = token_text(settings.get("pad_token"))
    template = settings.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
      named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
      template = named.get("default", next(iter(named.values()), None))
    return cls(Backend.from_file(path), eos_token=eos, pad_token=pad,
               chat_template=template if isinstance(template, str) else None)

  def save(self, directory: str) -> None:
    """Writes tokenizer.json and a tokenizer_config.json that transformers' AutoTokenizer reads."""
    os.makedirs(directory, exist_ok=True)
    self.backend.save(os.path.join(directory, "tokenizer.json"))
    specials = [t for t in CHATML_SPECIAL_TOKENS if self.backend.token_to_id(t) is not None]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token,
              "pad_token": self.pad_token, "bos_token": None, "unk_token": None,
              "additional_special_tokens": [t for t in specials
                                            if t not in (self.eos_token, self.pad_token)],
              "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30}
    if self.chat_template is not None:
      config["chat_template"] = self.chat_template
    elif len(specials) == len(CHATML_SPECIAL_TOKENS):
      config["chat_template"] = CHATML_JINJA
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump(config, f, indent=2, sort_keys=True)

  # ------------------------------------------------------------------ encode / decode

  @property
  def vocab_size(self) -> int:
    """Number of token ids, special tokens included."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no special tokens added)."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, encoded in parallel by `tokenizers`."""
    return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens dropped unless skip_special_tokens=False."""
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def decode_batch(self, batch: Iterable[Iterable[int]], *,
                   skip_special_tokens: bool = True) -> list[str]:
    """`decode` for each id list."""
    return self.backend.decode_batch([[int(i) for i in ids] for ids in batch],
                                     skip_special_tokens=skip_special_tokens)

  def truncate_at_eos(self, ids: Sequence[int]) -> list[int]:
    """`ids` up to and including the first EOS."""
    ids = list(ids)
    return ids[:ids.index(self.eos_id) + 1] if self.eos_id in ids else ids

  def pad(self, sequences: Sequence[Sequence[int]], *, length: int | None = None,
          side: str = "left", truncation: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pads to one length (prompts left, responses right).

    Args:
      sequences: token id lists.
      length: target length (default: the longest sequence).
      side: "left" or "right" padding.
      truncation: None (a longer sequence is an error), "left" (keep the end)
        or "right" (keep the start).
    Returns:
      (ids, mask): int32 [B, length] with `pad_id` at padding, and int32 mask
      with 1 on real tokens.
    """
    if side not in ("left", "right"):
      raise ValueError(f"side={side!r}; allowed: 'left', 'right'.")
    if truncation not in (None, "left", "right"):
      raise ValueError(f"truncation={truncation!r}; allowed: None, 'left', 'right'.")
    length = max((len(s) for s in sequences), default=0) if length is None else length
    ids = np.full((len(sequences), length), self.pad_id, np.int32)
    mask = np.zeros((len(sequences), length), np.int32)
    for row, sequence in enumerate(sequences):
      sequence = list(sequence)
      if len(sequence) > length:
        if truncation is None:
          raise ValueError(f"sequence {row} has {len(sequence)} tokens, more than length="
                           f"{length}; pass truncation='left' or 'right'.")
        sequence = sequence[-length:] if truncation == "left" else sequence[:length]
      n = len(sequence)
      if not n:
        continue
      span = slice(length - n, length) if side == "left" else slice(0, n)
      ids[row, span] = sequence
      mask[row, span] = 1
    return ids, mask

  # ------------------------------------------------------------------ chat

  def apply_chat_template(self, messages: Sequence[dict[str, str]], *,
                          add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template rendered as transformers does
    (`models.chat_template.render_chat`), or without one ChatML:
    `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message (Qwen2's format).

    Args:
      messages: [{"role": ..., "content": ...}, ...].
      add_generation_prompt: end with the opening of an assistant turn.
    Returns:
      The prompt text (encode it with `encode`).
    """
    if self.chat_template is not None:
      return render_chat(self.chat_template, messages,
                         add_generation_prompt=add_generation_prompt,
                         special_tokens=self.special_tokens())
    for token in CHATML_SPECIAL_TOKENS[1:]:
      self._id_of(token, "chat template token")
    parts = []
    for index, message in enumerate(messages):
      if set(message) != {"role", "content"}:
        raise ValueError(f"messages[{index}] must have exactly the keys 'role' and 'content'; "
                         f"got {sorted(message)}.")
      parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
      parts.append("<|im_start|>assistant\n")
    return "".join(parts)

  def special_tokens(self) -> dict[str, str | None]:
    """The special tokens a chat template may read (bos_token, eos_token, pad_token)."""
    return {"bos_token": None, "eos_token": self.eos_token, "pad_token": self.pad_token}

  def turn_suffix(self, role: str, content: str, *, turn_end: str = "") -> str:
    """The text that adds a `role` turn after a model turn ended by `turn_end` and opens
    the next assistant turn, under the chat template (ChatML without one):
    `models.chat_template.turn_suffix`."""
    template = self.chat_template
    if template is None:
      for token in CHATML_SPECIAL_TOKENS[1:]:
        self._id_of(token, "chat template token")
      template = CHATML_JINJA
    return turn_suffix(template, role, content, turn_end=turn_end,
                       special_tokens=self.special_tokens())


def build_character_tokenizer(characters: str, *,
                              special_tokens: Sequence[str] = CHATML_SPECIAL_TOKENS
                              ) -> Tokenizer:
  """A character-level tokenizer: special tokens first (ids 0..), then one id per character.

  Text with a character outside `characters` raises at encode time (no
  silent UNK). Suits the built-in arithmetic task, where every digit must be
  its own token.
  """
  from tokenizers import Tokenizer as Backend
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import pre_tokenizers
  from tokenizers import Regex

  unique = list(dict.fromkeys(characters))
  vocab = {token: i for i, token in enumerate(special_tokens)}
  for character in unique:
    if character in vocab:
      raise ValueError(f"character {character!r} collides with a special token.")
    vocab[character] = len(vocab)
  backend = Backend(models.WordLevel(vocab, unk_token=None))
  # Any character, newlines included (Oniguruma's "." is not), so "\n\n" is two tokens,
  # not one unknown piece.
  backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  backend.decoder = decoders.Fuse()
  backend.add_special_tokens(list(special_tokens))
  return Tokenizer(backend, eos_token=special_tokens[0])


def train_bpe_tokenizer(corpus: Iterable[str], *, vocab_size: int,
                        special_tokens: Sequence[str] = CHATML_SPECIAL_TOKENS) -> Tokenizer:
  """A byte-level BPE tokenizer trained on `corpus` (Qwen2-style: digits split singly)."""
  from tokenizers import Tokenizer as Backend
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import pre_tokenizers
  from tokenizers import trainers
  from tokenizers import Regex

  backend = Backend(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(r"\p{N}| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+"), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  backend.train_from_iterator(corpus, trainer=trainer)
  return Tokenizer(backend, eos_token=special_tokens[0])
