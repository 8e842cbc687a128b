"""How an `Example` becomes the tokens the model is given: the one place every consumer
(rollouts, multi-turn episodes, evaluation, best-of-n, Q♯, labelling, judges' prompts)
turns a prompt into text and ids.

`data.chat_template` decides when the tokenizer's chat template renders a prompt, as
transformers' `apply_chat_template(messages, add_generation_prompt=True)` does:

  'auto'    chat-list prompts (`messages`) are rendered; plain-string prompts stay raw
            text (TRL's rule)
  'always'  a plain-string prompt becomes one user turn and is rendered too
  'never'   raw text: a chat-list row gives its last user turn (the arith tasks' format)

`data.system_prompt` adds a system turn to rendered rows that have none, and
`data.chat_template_kwargs` gives the template its variables (Qwen3's `enable_thinking`).
A chat-list prompt with a tokenizer that has no template is an error, never a silent
fallback; plain-string prompts sent raw to a checkpoint that has a template get one
console line (`raw_prompts_note`).

A row's text is bounded in characters before it is rendered or tokenised: more than
`prompt_length × MAX_CHARS_PER_TOKEN` characters cannot fit `prompt_length` tokens (a
token of a real tokenizer covers ~3–5 characters of prose or code), so it is refused
naming the row at once, where a 50 MB row was rendered and tokenised for a minute and
aborted the process (the environment's observations have the same bound, envs/).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from rlhf_jax.data.example import Example

CHAT_TEMPLATE_MODES = ("auto", "always", "never")
# The most characters one token can stand for, as far as a length check is concerned;
# also the default of `env.max_chars_per_token`.
MAX_CHARS_PER_TOKEN = 16


class PromptError(ValueError):
  """A prompt that cannot be rendered or is too long (the message names the row)."""


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """Example → prompt text and token ids.

  Attributes:
    tokenizer: the policy's tokenizer (`encode`, `apply_chat_template`, `chat_template`).
    prefix: token ids put before every prompt (a policy's prompt_format.json).
    chat_template: 'auto', 'always' or 'never' (module docstring).
    system_prompt: a system turn for rendered rows without one ("" = none).
    prompt_length: P, the most prompt tokens (prefix included); 0 = no limit.
    length_name: what sets `prompt_length`, for the error (a launcher's flag).
    template_kwargs: template variables of every rendering ({"enable_thinking": False};
      `data.chat_template_kwargs`), as transformers' apply_chat_template(**kwargs).
  """
  tokenizer: Any
  prefix: tuple[int, ...] = ()
  chat_template: str = "auto"
  system_prompt: str = ""
  prompt_length: int = 0
  length_name: str = "data.prompt_length"
  template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

  def __post_init__(self):
    if self.chat_template not in CHAT_TEMPLATE_MODES:
      raise ValueError(f"chat_template={self.chat_template!r}; allowed: "
                       f"{', '.join(CHAT_TEMPLATE_MODES)}.")
    object.__setattr__(self, "prefix", tuple(int(i) for i in self.prefix))

  def messages(self, example: Example) -> list[dict[str, Any]] | None:
    """The turns the chat template renders for `example`, or None for raw text."""
    if self.chat_template == "never":
      return None
    if example.messages is not None:
      turns = [dict(m) for m in example.messages]
    elif self.chat_template == "always":
      turns = [{"role": "user", "content": example.prompt}]
    else:
      return None
    return self.with_system(turns)

  def with_system(self, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`turns` with `system_prompt` as the first turn when they have no system turn."""
    if self.system_prompt and not any(t.get("role") == "system" for t in turns):
      return [{"role": "system", "content": self.system_prompt}] + turns
    return turns

  def require_template(self, where: str) -> None:
    """PromptError naming `where` when the tokenizer has no chat template to render a
    chat with (never a silent fallback to another format)."""
    if getattr(self.tokenizer, "chat_template", None) is None:
      raise PromptError(f"{where}: a chat prompt, but the tokenizer has no chat template "
                        "(add one to tokenizer_config.json or chat_template.jinja, or set "
                        "data.chat_template='never' to give the model the last user turn)")

  def text(self, example: Example, where: str = "a prompt") -> str:
    """The prompt text as the model sees it after the prefix: the rendered chat, or the
    raw prompt. `where` starts the error of a row that cannot be rendered."""
    turns = self.messages(example)
    if turns is None:
      return example.prompt
    self.require_template(where)
    try:
      return self.render(turns)
    except ValueError as error:
      raise PromptError(f"{where}: the chat template cannot render it: {error}") from None

  def render(self, turns: Sequence[Mapping[str, Any]], *, generation: bool = True) -> str:
    """`turns` under the tokenizer's chat template with `template_kwargs`, ending with
    the opening of an assistant turn when `generation` (transformers'
    add_generation_prompt)."""
    return self.tokenizer.apply_chat_template(list(turns), add_generation_prompt=generation,
                                              **self.template_kwargs)

  def check_characters(self, example: Example, where: str = "a prompt") -> None:
    """PromptError naming `where` when the row's text (its turns' contents and the system
    prompt, or the raw prompt) has more characters than `prompt_length` tokens can hold
    (module docstring); nothing is rendered or tokenised to tell."""
    if not self.prompt_length:
      return
    turns = self.messages(example)
    if turns is None:
      characters = len(example.prompt)
    else:
      characters = sum(len(c) if isinstance(c, str) else len(str(c))
                       for c in (t.get("content") for t in turns) if c is not None)
    limit = self.prompt_length * MAX_CHARS_PER_TOKEN
    if characters > limit:
      raise PromptError(f"{where}: the prompt has {characters} characters, more than "
                        f"{self.length_name}={self.prompt_length} tokens can hold (at most "
                        f"{MAX_CHARS_PER_TOKEN} characters per token: {limit})")

  def encode(self, example: Example, where: str = "a prompt") -> list[int]:
    """The prompt's token ids (prefix + text); more characters than `prompt_length` can
    hold (`check_characters`), longer than `prompt_length` in tokens, a character the
    tokenizer cannot encode, or a template error: PromptError."""
    self.check_characters(example, where)
    text = self.text(example, where)
    try:
      ids = list(self.prefix) + list(self.tokenizer.encode(text))
    except Exception as error:  # tokenizers raises its own type (e.g. a missing [UNK])
      raise PromptError(f"{where}: the tokenizer cannot encode the prompt ({error}): "
                        f"{text[:60]!r}") from None
    if self.prompt_length and len(ids) > self.prompt_length:
      raise PromptError(f"{where}: the prompt has {len(ids)} tokens, more than "
                        f"{self.length_name}={self.prompt_length}: {text[:60]!r}...")
    return ids

  def encode_all(self, examples: Sequence[Example]) -> list[list[int]]:
    """`encode` of each example."""
    return [self.encode(e) for e in examples]

  def decoded(self, example: Example) -> str:
    """The whole prompt as text, prefix tokens included (what a reward function is
    given as the prompt the model saw)."""
    prefix = self.tokenizer.decode(self.prefix, skip_special_tokens=False) if self.prefix else ""
    return prefix + self.text(example)


def raw_prompts_note(prompt_format: PromptFormat, examples: Sequence[Example],
                     where: str) -> str | None:
  """One line when `data.chat_template='auto'` sends plain-string prompts of `examples`
  (read from `where`) raw to a tokenizer that has a chat template (an instruct model then
  sees text it was not tuned on: TRL's rule, rarely the intent); None otherwise."""
  if prompt_format.chat_template != "auto" or not getattr(prompt_format.tokenizer,
                                                          "chat_template", None):
    return None
  raw = sum(e.messages is None for e in examples)
  if not raw:
    return None
  return (f"{where}: {raw} of {len(examples)} prompts are plain strings, sent to the model "
          "raw although its checkpoint has a chat template (data.chat_template='auto'); "
          "--config.data.chat_template=always renders each as a user turn")


def conversation_text(example: Example) -> str:
  """The prompt as plain text for a judge's question template: a chat-list prompt as
  its turns, one "role: content" paragraph each (no model's special tokens, which the
  judge's tokenizer would read as its own); a plain prompt as it is."""
  if example.messages is None:
    return example.prompt
  return "\n\n".join(f"{m['role']}: {m.get('content') or ''}" for m in example.messages) + "\n"


def check_prompts(prompt_format: PromptFormat,
                  located: Sequence[tuple[str, Example]]) -> int:
  """Encodes every (where, example) row; the first that fails raises PromptError naming
  its file and row (also a plain-text row that a `system_prompt` would not reach). Returns
  the longest prompt in tokens."""
  longest = 0
  for where, example in located:
    if prompt_format.system_prompt and prompt_format.messages(example) is None:
      raise PromptError(f"{where}: a plain-text prompt, which data.system_prompt does not "
                        "reach (it is added to chat prompts); set data.chat_template="
                        "'always' to render plain prompts as a user turn")
    longest = max(longest, len(prompt_format.encode(example, where)))
  return longest
