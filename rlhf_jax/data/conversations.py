"""Supervised rows from one's own data: conversations (`messages`) or prompt/completion
pairs, as token rows whose loss mask is 1 on the assistant's tokens only.

A conversation is rendered with the tokenizer's chat template turn by turn, by
difference (as transformers' `{% generation %}` spans mark them): the prompt is the
conversation up to its first assistant turn with the generation prompt; each assistant
turn's span is what rendering it adds to the conversation before it; the user and tool
turns between assistant turns are context (mask 0). Each piece is tokenised on its own,
as a multi-turn rollout appends them, so the mask boundaries are exact. A span that does
not end with the tokenizer's EOS gets one (the policy must learn to stop).

Layouts (TRL's SFT datasets): {"messages": [...]}; {"prompt": str, "completion": str};
{"prompt": [...], "completion": [...]} (conversational prompt-completion).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from rlhf_jax.data.example import Example
from rlhf_jax.data.example import is_chat
from rlhf_jax.data.prompts import MAX_CHARS_PER_TOKEN
from rlhf_jax.data.prompts import PromptFormat


@dataclasses.dataclass(frozen=True)
class SupervisedRow:
  """One training row: prompt ids, response ids and the response's 0/1 loss mask."""
  prompt_ids: list[int]
  response_ids: list[int]
  loss_mask: list[int]


def _render(prompts: PromptFormat, messages: Sequence[Mapping[str, Any]], *,
            generation: bool) -> str:
  return prompts.render(messages, generation=generation)


def _after(longer: str, shorter: str, where: str) -> str:
  if not longer.startswith(shorter):
    raise ValueError(f"{where}: the chat template renders a later turn by rewriting the "
                     "turns before it; its assistant spans cannot be marked.")
  return longer[len(shorter):]


def _conversation(prompts: PromptFormat, messages: list[dict], where: str, start: int = 0
                  ) -> SupervisedRow:
  """The row of `messages` whose assistant turns from index `start` on are trained."""
  turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i >= start]
  if not turns:
    raise ValueError(f"{where}: no assistant turn to train on.")
  prompts.require_template(where)
  with_system = prompts.with_system(messages)
  turns = [i + len(with_system) - len(messages) for i in turns]
  messages = with_system
  tok = prompts.tokenizer
  before = _render(prompts, messages[:turns[0]], generation=True)
  prompt_ids = list(prompts.prefix) + tok.encode(before)
  response, mask = [], []
  done = before
  for number, index in enumerate(turns):
    if number:  # the user / tool turns since the last assistant turn: context
      context = _render(prompts, messages[:index], generation=True)
      ids = tok.encode(_after(context, done, where))
      response += ids
      mask += [0] * len(ids)
      done = context
    rendered = _render(prompts, messages[:index + 1], generation=False)
    ids = tok.encode(_after(rendered, done, where))
    if index == turns[-1] and tok.eos_id not in ids:
      ids.append(tok.eos_id)
    response += ids
    mask += [1] * len(ids)
    done = rendered
  return SupervisedRow(prompt_ids, response, mask)


def _is_conversation(value: Any) -> bool:
  """A list of turns with string roles (content may be None: an assistant's tool calls)."""
  return isinstance(value, (list, tuple)) and bool(value) and all(
      isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value)


def supervised_row(record: Mapping[str, Any], where: str, prompts: PromptFormat
                   ) -> SupervisedRow:
  """One record (module docstring's layouts) → its SupervisedRow; errors name `where`."""
  if not isinstance(record, Mapping):
    raise ValueError(f"{where}: expected an object, got {type(record).__name__}.")
  if "messages" in record:
    if not _is_conversation(record["messages"]):
      raise ValueError(f"{where}: field 'messages' must be a list of objects with a "
                       "string 'role'.")
    return _conversation(prompts, [dict(m) for m in record["messages"]], where)
  if "prompt" not in record or "completion" not in record:
    raise ValueError(f"{where}: needs 'messages', or 'prompt' and 'completion'; there: "
                     f"{sorted(record)}.")
  prompt, completion = record["prompt"], record["completion"]
  if _is_conversation(prompt) and _is_conversation(completion):
    return _conversation(prompts, [dict(m) for m in prompt] + [dict(m) for m in completion],
                         where, start=len(prompt))
  if not isinstance(completion, str) or not (isinstance(prompt, str) or is_chat(prompt)):
    raise ValueError(f"{where}: 'prompt' must be text or a chat list and 'completion' text "
                     "(or both chat lists).")
  example = Example(prompt if isinstance(prompt, str) else "", "", "",
                    messages=prompt if is_chat(prompt) else None)
  prompt_ids = prompts.encode(example, where)
  response = prompts.tokenizer.encode(completion) + [prompts.tokenizer.eos_id]
  return SupervisedRow(prompt_ids, response, [1] * len(response))


def check_row(row: SupervisedRow, where: str, *, prompt_length: int,
              response_length: int) -> SupervisedRow:
  """`row` when it fits the batch layout; else a ValueError naming `where`."""
  if len(row.prompt_ids) > prompt_length:
    raise ValueError(f"{where}: the prompt has {len(row.prompt_ids)} tokens, more than "
                     f"data.prompt_length={prompt_length}.")
  if len(row.response_ids) > response_length:
    raise ValueError(f"{where}: the response has {len(row.response_ids)} tokens, more than "
                     f"sft.response_length={response_length}.")
  return row


def check_characters(record: Any, where: str, *, prompt_length: int,
                     response_length: int) -> None:
  """ValueError naming `where` when a record's text (its turns, prompt and completion)
  has more characters than `prompt_length + response_length` tokens can hold (at most
  MAX_CHARS_PER_TOKEN a token): checked before the row is rendered or tokenised, as a
  prompt's is (data/prompts.py)."""
  characters = sum(map(len, record_texts(record)))
  limit = (prompt_length + response_length) * MAX_CHARS_PER_TOKEN
  if characters > limit:
    raise ValueError(f"{where}: the row has {characters} characters, more than "
                     f"data.prompt_length + sft.response_length = {prompt_length} + "
                     f"{response_length} tokens can hold (at most {MAX_CHARS_PER_TOKEN} "
                     f"characters per token: {limit}).")


def record_texts(record: Mapping[str, Any]) -> list[str]:
  """The text of a record's turns, prompt and completion (a tokenizer's training corpus)."""
  out = []
  for key in ("messages", "prompt", "completion"):
    value = record.get(key) if isinstance(record, Mapping) else None
    if isinstance(value, str):
      out.append(value)
    elif _is_conversation(value):
      out.extend(m["content"] for m in value if isinstance(m.get("content"), str))
  return out
