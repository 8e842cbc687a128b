"""Tokenizer directories: which chat templates and special tokens `Tokenizer.from_directory`
reads (against transformers' AutoTokenizer on the same files), and what `save` writes."""

import json
import pathlib

import pytest

from rlhf_jax import models
from tests.models.chat_fixtures import assert_parity
from tests.models.chat_fixtures import template
from tests.models.chat_fixtures import write_checkpoint

transformers = pytest.importorskip("transformers")

ASK = [{"role": "user", "content": "What is the temperature?"}]
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {}}}
# Small templates that say which one rendered.
DEFAULT = "D{% for m in messages %}[{{ m.content }}]{% endfor %}"
TOOL_USE = "T{{ tools | length }}{% for m in messages %}[{{ m.content }}]{% endfor %}"
RAG = "R{{ documents[0].text }}"


def _files(directory: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(directory)): p.read_bytes()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def _config(directory: pathlib.Path) -> dict:
  return json.loads((directory / "tokenizer_config.json").read_text())


def _set_config(directory: pathlib.Path, **changes) -> None:
  config = _config(directory)
  config.update(changes)
  for key in [k for k, v in changes.items() if v is ...]:
    del config[key]
  (directory / "tokenizer_config.json").write_text(json.dumps(config))


def _both(directory):
  return (models.Tokenizer.from_directory(str(directory)),
          transformers.AutoTokenizer.from_pretrained(str(directory)))


@pytest.fixture(name="checkpoint")
def fixture_checkpoint(tmp_path):
  """A Qwen2.5-layout directory with the published template in tokenizer_config.json."""
  return write_checkpoint(tmp_path / "qwen", "qwen2_5_instruct")


def test_template_files_take_precedence_over_the_config(checkpoint):
  (checkpoint / "chat_template.jinja").write_text(DEFAULT)
  ours, reference = _both(checkpoint)
  assert ours.chat_template == reference.chat_template == DEFAULT
  assert_parity(ours, reference, ASK, add_generation_prompt=True)
  # Named templates beside it: the "default" one without a name, "tool_use" with tools,
  # any by name; all reachable through `chat_templates`.
  (checkpoint / "additional_chat_templates").mkdir()
  (checkpoint / "additional_chat_templates/tool_use.jinja").write_text(TOOL_USE)
  (checkpoint / "additional_chat_templates/rag.jinja").write_text(RAG)
  ours, reference = _both(checkpoint)
  assert ours.chat_templates == reference.chat_template == {
      "default": DEFAULT, "tool_use": TOOL_USE, "rag": RAG}
  assert ours.chat_template == DEFAULT
  assert_parity(ours, reference, ASK, add_generation_prompt=True)
  assert assert_parity(ours, reference, ASK, tools=[TOOL])[0] == "T1[What is the temperature?]"
  documents = [{"title": "t", "text": "doc"}]
  assert assert_parity(ours, reference, ASK, chat_template="rag", documents=documents)[0] == (
      "Rdoc")
  with pytest.raises(ValueError, match="chat_template='nope' is neither a Jinja template"):
    ours.apply_chat_template(ASK, chat_template="nope")


def test_named_templates_in_the_config(checkpoint):
  _set_config(checkpoint, chat_template=[{"name": "tool_use", "template": TOOL_USE},
                                         {"name": "default", "template": DEFAULT}])
  ours, reference = _both(checkpoint)
  assert ours.chat_templates == reference.chat_template
  assert_parity(ours, reference, ASK, tools=[TOOL], add_generation_prompt=False)
  assert ours.apply_chat_template(ASK) == "D[What is the temperature?]"
  # Without a default, a name is needed (transformers raises too).
  _set_config(checkpoint, chat_template=[{"name": "tool_use", "template": TOOL_USE}])
  ours, reference = _both(checkpoint)
  assert ours.chat_template is None and ours.chat_templates == {"tool_use": TOOL_USE}
  with pytest.raises(ValueError, match=r"templates \['tool_use'\] is named 'default'; pass"):
    ours.apply_chat_template(ASK)
  with pytest.raises(ValueError):
    reference.apply_chat_template(ASK, tokenize=False)
  _set_config(checkpoint, chat_template=[{"template": DEFAULT}])
  with pytest.raises(ValueError, match="tokenizer_config.json: chat_template is a list but"):
    models.Tokenizer.from_directory(str(checkpoint))


def test_the_processors_legacy_template_file_is_the_last_resort(checkpoint):
  # AutoTokenizer does not read chat_template.json (AutoProcessor does); it is read here
  # only when nothing else gives a template.
  (checkpoint / "chat_template.json").write_text(json.dumps({"chat_template": DEFAULT}))
  assert models.Tokenizer.from_directory(str(checkpoint)).chat_template == (
      template("qwen2_5_instruct"))
  _set_config(checkpoint, chat_template=...)
  assert models.Tokenizer.from_directory(str(checkpoint)).chat_template == DEFAULT


def test_special_tokens_are_read_with_transformers_precedence(checkpoint):
  ours, reference = _both(checkpoint)
  assert ours.special_tokens() == reference.special_tokens_map == {
      "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
  # special_tokens_map.json counts only for a config without added_tokens_decoder.
  mapping = {"bos_token": {"content": "<|im_start|>", "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False},
             "eos_token": "<|endoftext|>"}
  (checkpoint / "special_tokens_map.json").write_text(json.dumps(mapping))
  ours, reference = _both(checkpoint)
  assert ours.special_tokens() == reference.special_tokens_map
  assert ours.eos_token == "<|im_end|>"
  _set_config(checkpoint, added_tokens_decoder=..., unk_token="<|endoftext|>",
              image_token={"__type": "AddedToken", "content": "<|im_start|>"})
  ours, reference = _both(checkpoint)
  assert ours.special_tokens() == reference.special_tokens_map == {
      "bos_token": "<|im_start|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
      "unk_token": "<|endoftext|>", "image_token": "<|im_start|>"}
  assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|endoftext|>")
  assert ours.eos_id == reference.eos_token_id
  assert_parity(ours, reference, ASK, add_generation_prompt=True)


def test_saving_a_loaded_tokenizer_keeps_its_files(checkpoint, tmp_path):
  (checkpoint / "special_tokens_map.json").write_text('{"eos_token": "<|im_end|>"}\n')
  (checkpoint / "chat_template.jinja").write_text(DEFAULT + "\r\n")
  (checkpoint / "additional_chat_templates").mkdir()
  (checkpoint / "additional_chat_templates/tool_use.jinja").write_text(TOOL_USE)
  (checkpoint / "README.md").write_text("not a tokenizer file")
  loaded, reference = _both(checkpoint)
  assert loaded.chat_templates == reference.chat_template == {"default": DEFAULT + "\n",
                                                              "tool_use": TOOL_USE}
  target = tmp_path / "saved"
  target.mkdir()
  (target / "chat_template.json").write_text(json.dumps({"chat_template": RAG}))  # stale
  loaded.save(str(target))
  expected = _files(checkpoint)
  del expected["README.md"]
  assert _files(target) == expected
  loaded.save(str(checkpoint))  # onto its own directory: unchanged
  assert _files(checkpoint) == {**expected, "README.md": b"not a tokenizer file"}
  # A template changed after loading is written where it takes precedence.
  loaded.chat_template = RAG
  loaded.save(str(target))
  assert (target / "tokenizer_config.json").read_bytes() == expected["tokenizer_config.json"]
  ours, reference = _both(target)
  assert ours.chat_templates == reference.chat_template == {"default": RAG,
                                                            "tool_use": TOOL_USE}
  loaded.chat_templates.clear()
  with pytest.raises(ValueError, match="chat templates loaded from its directory were removed"):
    loaded.save(str(target))


def test_a_tokenizer_built_in_memory_writes_its_own_config(tmp_path):
  built = models.train_bpe_tokenizer(["a b c 1 2 3"] * 20, vocab_size=300)
  (tmp_path / "chat_template.jinja").write_text(DEFAULT)  # stale: would take precedence
  built.save(str(tmp_path))
  assert not (tmp_path / "chat_template.jinja").exists()
  config = _config(tmp_path)
  assert config["chat_template"] == models.tokenizer.CHATML_JINJA
  assert config["bos_token"] is None and config["eos_token"] == "<|endoftext|>"
  ours, reference = _both(tmp_path)
  assert ours.chat_template == models.tokenizer.CHATML_JINJA and built.chat_template is None
  assert_parity(ours, reference, ASK, add_generation_prompt=True)
  assert built.apply_chat_template(ASK) == ours.apply_chat_template(ASK)
  # Named templates are written in the config's list form.
  built.chat_templates.update(default=DEFAULT, tool_use=TOOL_USE)
  built.save(str(tmp_path))
  ours, reference = _both(tmp_path)
  assert ours.chat_templates == reference.chat_template == {"default": DEFAULT,
                                                            "tool_use": TOOL_USE}
