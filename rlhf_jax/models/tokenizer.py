"""A thin wrapper over HF `tokenizers` (`tokenizer.json`): batch encode/decode, padding
into fixed-shape int32 arrays, EOS/PAD handling, and chat templates read and rendered as
transformers does (`models.chat_template`), or a built-in ChatML; plus two small tokenizers
built locally (character-level and byte-level BPE) for tests and demos.

`encode(apply_chat_template(messages))` gives transformers' `apply_chat_template(messages,
tokenize=True)`: transformers tokenizes the rendered text with `add_special_tokens=False`
(no BOS of its own; the template writes the BOS, as Llama 3's does), and so does `encode`.

Needs the `hf` extra (tokenizers).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from rlhf_jax.models import chat_template as chat_lib
from rlhf_jax.models import template_bounds

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The Jinja form of `Tokenizer.apply_chat_template`, written to tokenizer_config.json so
# transformers renders the same string.
CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The files of a tokenizer directory that `save` writes back as they were read (with
# additional_chat_templates/*.jinja).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", chat_lib.TEMPLATE_FILE, chat_lib.LEGACY_TEMPLATE_FILE,
                   "vocab.json", "merges.txt", "tokenizer.model")
# Files that change what a directory renders or names; a save removes stale ones.
_RENDERING_FILES = ("special_tokens_map.json", "added_tokens.json", chat_lib.TEMPLATE_FILE,
                    chat_lib.LEGACY_TEMPLATE_FILE)


class Tokenizer:
  """Encode / decode / pad with special-token handling.

  Args (constructor):
    backend: a `tokenizers.Tokenizer`.
    eos_token: the end-of-sequence token (must be in the vocabulary).
    pad_token: the padding token (default: the EOS token, as Qwen2 does).
    bos_token: the beginning-of-sequence token, if any (templates write it).
    chat_template: the Jinja chat template, or None (with no `chat_templates` either: the
      built-in ChatML, `CHATML_JINJA`).
    chat_templates: named templates ({"default": ..., "tool_use": ...}); `chat_template`
      is the "default" one.
    special_tokens: the named special tokens a template sees (transformers'
      `special_tokens_map`); default: bos/eos/pad as given.
  """

  def __init__(self, backend, *, eos_token: str = "<|endoftext|>",
               pad_token: str | None = None, bos_token: str | None = None,
               chat_template: str | None = None, chat_templates: Mapping[str, str] | None = None,
               special_tokens: Mapping[str, str] | None = None):
    self.backend = backend
    self.chat_templates = dict(chat_templates or {})
    if chat_template is not None:
      self.chat_template = chat_template
    self.bos_token = bos_token
    self.eos_token = eos_token
    self.pad_token = eos_token if pad_token is None else pad_token
    self.eos_id = self._id_of(self.eos_token, "eos_token")
    self.pad_id = self._id_of(self.pad_token, "pad_token")
    if special_tokens is None:
      special_tokens = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": self.pad_token}
    self._named = {k: v for k, v in special_tokens.items() if v is not None}
    self._files: dict[str, bytes] | None = None  # what `from_directory` read, for `save`
    self._loaded_templates: dict[str, str] = {}
    self.template_timeout_s = template_bounds.DEFAULT_TIMEOUT_S  # renders: template_bounds
    self.template_files: dict[str, str] = {}  # template text → the file it was read from

  @property
  def chat_template(self) -> str | None:
    """The template used without a name ("default"); None: the checkpoint has none."""
    return self.chat_templates.get("default")

  @chat_template.setter
  def chat_template(self, template: str | None) -> None:
    if template is None:
      self.chat_templates.pop("default", None)
    else:
      self.chat_templates["default"] = template

  def _id_of(self, token: str, what: str) -> int:
    token_id = self.backend.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{what}={token!r} is not in the tokenizer's vocabulary.")
    return token_id

  # ------------------------------------------------------------------ loading

  @classmethod
  def from_directory(cls, directory: str) -> "Tokenizer":
    """Loads `tokenizer.json`, the named special tokens and the chat templates of a tokenizer
    directory (`models.chat_template.read_special_tokens`, `read_chat_templates`)."""
    from tokenizers import Tokenizer as Backend  # the `hf` extra

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist.")
    config = chat_lib.read_json(os.path.join(directory, "tokenizer_config.json"))
    named = chat_lib.read_special_tokens(directory, config)
    templates = chat_lib.read_chat_templates(directory, config)
    try:
      backend = Backend.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception that names no file
      raise ValueError(f"{path}: not a readable tokenizer ({error}).") from None
    tokenizer = cls(backend,
                    eos_token=named.get("eos_token") or CHATML_SPECIAL_TOKENS[0],
                    pad_token=named.get("pad_token"), bos_token=named.get("bos_token"),
                    chat_templates=templates, special_tokens=named)
    tokenizer._files = _read_files(directory)
    tokenizer._loaded_templates = dict(templates)
    tokenizer.template_files = chat_lib.template_files(directory, templates)
    return tokenizer

  def save(self, directory: str) -> None:
    """Writes the tokenizer so that transformers' AutoTokenizer and `from_directory` read
    it back. One loaded from a directory writes that directory's files byte for byte (a
    template changed since goes to chat_template.jinja, which takes precedence); one built
    in memory writes tokenizer.json and a tokenizer_config.json of its own."""
    os.makedirs(directory, exist_ok=True)
    if self._files is None:
      files = {"tokenizer.json": self.backend.to_str(pretty=True).encode(),
               "tokenizer_config.json": json.dumps(self._config(), indent=2,
                                                   sort_keys=True).encode()}
    else:
      files = dict(self._files)
      if self.chat_templates != self._loaded_templates:
        if not self.chat_templates:
          raise ValueError(f"Tokenizer.save: the chat templates loaded from its directory were "
                           f"removed; {directory} cannot express that.")
        files = {name: data for name, data in files.items()
                 if name not in (chat_lib.TEMPLATE_FILE, chat_lib.LEGACY_TEMPLATE_FILE)
                 and not name.startswith(chat_lib.TEMPLATE_DIR + "/")}
        for name, template in self.chat_templates.items():
          path = (chat_lib.TEMPLATE_FILE if name == "default"
                  else f"{chat_lib.TEMPLATE_DIR}/{name}.jinja")
          files[path] = template.encode("utf-8")
    _write_files(directory, files)

  def _config(self) -> dict[str, Any]:
    """The tokenizer_config.json of a tokenizer built in memory."""
    specials = [t for t in CHATML_SPECIAL_TOKENS if self.backend.token_to_id(t) is not None]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token,
              "pad_token": self.pad_token, "bos_token": self.bos_token,
              "unk_token": self._named.get("unk_token"),
              "additional_special_tokens": [t for t in specials
                                            if t not in (self.eos_token, self.pad_token)],
              "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30}
    if set(self.chat_templates) == {"default"}:
      config["chat_template"] = self.chat_template
    elif self.chat_templates:
      config["chat_template"] = [{"name": k, "template": v} for k, v in self.chat_templates.items()]
    elif len(specials) == len(CHATML_SPECIAL_TOKENS):
      config["chat_template"] = CHATML_JINJA
    return config

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

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = True,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          documents: Sequence[Mapping[str, Any]] | None = None,
                          chat_template: str | None = None, **template_kwargs) -> str:
    """The chat as transformers' `apply_chat_template(..., tokenize=False)` renders it
    (`models.chat_template.render_chat`), or without a template ChatML:
    `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message (Qwen2's format; it reads
    no tools, documents or variables, as `CHATML_JINJA` does not).

    Args:
      messages: [{"role": ..., "content": ...}, ...] (tool_calls, reasoning_content, ...
        pass through to the template).
      add_generation_prompt: end with the opening of an assistant turn.
      tools: JSON schemas of the tools the template lists.
      documents: dicts for templates that do retrieval.
      chat_template: the name of one of `chat_templates`, or a Jinja source; default as
        transformers chooses: "tool_use" when there are tools and such a template, else
        "default".
      **template_kwargs: template variables (Qwen3's enable_thinking, Llama 3.1's
        date_string, tools_in_user_message, builtin_tools, ...).
    Returns:
      The prompt text (encode it with `encode`).
    """
    template = self._template(chat_template, tools)
    if template is not None:
      with chat_lib.errors_naming(self.template_files.get(template)):
        return chat_lib.render_chat(
            template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
            documents=documents, special_tokens=self.special_tokens(),
            timeout_s=self.template_timeout_s, **template_kwargs)
    chat_lib.check_template_kwargs(template_kwargs)
    self._check_chatml()
    parts = []
    for index, message in enumerate(messages):
      if set(message) != {"role", "content"}:
        raise ValueError(f"messages[{index}] must have exactly the keys 'role' and 'content'; "
                         f"got {sorted(message)}.")
      parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
      parts.append("<|im_start|>assistant\n")
    return "".join(parts)

  def _template(self, name_or_source: str | None, tools) -> str | None:
    """The template to render, chosen as transformers' `get_chat_template` chooses; None:
    the built-in ChatML."""
    templates = self.chat_templates
    if name_or_source is not None:
      if name_or_source in templates:
        return templates[name_or_source]
      if "{{" in name_or_source or "{%" in name_or_source:
        return name_or_source
      raise ValueError(f"chat_template={name_or_source!r} is neither a Jinja template nor one "
                       f"of the tokenizer's templates {sorted(templates)}.")
    if tools is not None and "tool_use" in templates:
      return templates["tool_use"]
    if templates and "default" not in templates:
      raise ValueError(f"none of the tokenizer's chat templates {sorted(templates)} is named "
                       "'default'; pass chat_template=<name>.")
    return templates.get("default")

  def _check_chatml(self) -> None:
    for token in CHATML_SPECIAL_TOKENS[1:]:
      self._id_of(token, "chat template token")

  def special_tokens(self) -> dict[str, str]:
    """The named special tokens a chat template sees (bos_token, eos_token, ...: those the
    tokenizer's files set, as transformers' `special_tokens_map`)."""
    return dict(self._named)

  def turn_suffix(self, role: str, content: str, *, turn_end: str = "",
                  template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The text that adds a `role` turn after a model turn ended by `turn_end` and opens
    the next assistant turn, under the chat template (ChatML without one) with the
    template variables `template_kwargs`: `models.chat_template.turn_suffix`."""
    template = self._template(None, None)
    if template is None:
      self._check_chatml()
      template = CHATML_JINJA
    with chat_lib.errors_naming(self.template_files.get(template)):
      return chat_lib.turn_suffix(template, role, content, turn_end=turn_end,
                                  special_tokens=self.special_tokens(),
                                  timeout_s=self.template_timeout_s,
                                  **dict(template_kwargs or {}))


def _read_files(directory: str) -> dict[str, bytes]:
  """The bytes of each of `directory`'s tokenizer files, by relative path."""
  names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, n))]
  extra = os.path.join(directory, chat_lib.TEMPLATE_DIR)
  if os.path.isdir(extra):
    names += [f"{chat_lib.TEMPLATE_DIR}/{n}" for n in sorted(os.listdir(extra))
              if n.endswith(".jinja")]
  files = {}
  for name in names:
    with open(os.path.join(directory, name), "rb") as f:
      files[name] = f.read()
  return files


def _write_files(directory: str, files: Mapping[str, bytes]) -> None:
  """Writes `files` into `directory` and removes the stale files there that would change
  what it renders (a chat_template.jinja of an earlier save takes precedence)."""
  extra = os.path.join(directory, chat_lib.TEMPLATE_DIR)
  stale = [n for n in _RENDERING_FILES if n not in files]
  if os.path.isdir(extra):
    stale += [f"{chat_lib.TEMPLATE_DIR}/{n}" for n in os.listdir(extra)
              if n.endswith(".jinja") and f"{chat_lib.TEMPLATE_DIR}/{n}" not in files]
  for name in stale:
    if os.path.isfile(os.path.join(directory, name)):
      os.remove(os.path.join(directory, name))
  for name, data in files.items():
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(data)


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
