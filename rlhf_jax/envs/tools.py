"""Tools for multi-turn agents: the tool-call parser, `calculator` and `python` (run in
the code sandbox), and `ToolEnvironment`, which runs the calls of each model turn.

A model calls tools in the Qwen2.5 / Hermes form, any number per turn:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12345 * 678"}}
    </tool_call>

(`TOOL_CALL`, configurable per environment). The environment answers with the results in
order, one per line, as a tool turn (`StepResult.role = "tool"`: the rollout renders it with
the tokenizer's chat template). A malformed call, an unknown tool or a failing tool gives an
`error: ...` line, never an exception; a turn without a call ends the episode (the model
answered).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
import re
import time
from typing import Any, Mapping, Protocol, Sequence

from rlhf_jax.envs.base import StepResult
from rlhf_jax.sandbox import jobs as sandbox

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolError(Exception):
  """A tool call that cannot be carried out; its message is what the model sees."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed call: the tool's name and its arguments."""
  name: str
  arguments: Mapping[str, Any]


def parse_tool_calls(text: str, pattern: re.Pattern = TOOL_CALL) -> list[ToolCall | str]:
  """Every call in `text`, in order: a ToolCall, or for a malformed one the reason (a str).

  A call's body is JSON {"name": str, "arguments": {...}}; `arguments` may also be a JSON
  string of an object (some models write it so).
  """
  calls = []
  for body in pattern.findall(text):
    try:
      call = json.loads(body)
    except json.JSONDecodeError as error:
      calls.append(f"the tool call is not JSON: {error.msg} at character {error.pos}")
      continue
    arguments = call.get("arguments", {}) if isinstance(call, dict) else None
    if isinstance(arguments, str):
      try:
        arguments = json.loads(arguments)
      except json.JSONDecodeError:
        arguments = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
      calls.append('a tool call needs {"name": str, "arguments": {...}}')
    elif not isinstance(arguments, dict):
      calls.append(f"the arguments of {call['name']!r} must be a JSON object")
    else:
      calls.append(ToolCall(name=call["name"], arguments=arguments))
  return calls


class Tool(Protocol):
  """A tool: its name, a one-line description, and the call."""
  name: str
  description: str

  def __call__(self, arguments: Mapping[str, Any]) -> str:
    """The result text; raises ToolError for a call it cannot carry out."""


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _string_argument(arguments: Mapping[str, Any], key: str, tool: str) -> str:
  value = arguments.get(key)
  if not isinstance(value, str):
    raise ToolError(f"{tool} needs a string argument {key!r}")
  return value


@dataclasses.dataclass
class Calculator:
  """`calculator`: an arithmetic expression (numbers, + - * / // % **, parentheses)
  evaluated exactly on integers; no names, calls or attributes. Exponents and results are
  bounded so a call cannot hang the worker."""
  name: str = "calculator"
  description: str = "Evaluates an arithmetic expression: {\"expression\": \"12 * (3 + 4)\"}"
  max_digits: int = 200

  def __call__(self, arguments: Mapping[str, Any]) -> str:
    expression = _string_argument(arguments, "expression", self.name)
    try:
      tree = ast.parse(expression, mode="eval")
    except SyntaxError:
      raise ToolError(f"cannot parse {expression!r}") from None
    value = self._evaluate(tree.body)
    return str(value)

  def _evaluate(self, node) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
      return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](self._evaluate(node.operand))
    if not (isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS):
      raise ToolError(f"only numbers and + - * / // % ** are allowed, not "
                      f"{type(node).__name__}")
    left, right = self._evaluate(node.left), self._evaluate(node.right)
    if isinstance(node.op, ast.Pow) and abs(right) * len(str(abs(left))) > self.max_digits:
      raise ToolError(f"the power has more than {self.max_digits} digits")
    try:
      value = _OPERATORS[type(node.op)](left, right)
    except (ZeroDivisionError, OverflowError) as error:
      raise ToolError(str(error)) from None
    if isinstance(value, int) and len(str(abs(value))) > self.max_digits:
      raise ToolError(f"the result has more than {self.max_digits} digits")
    return value


@dataclasses.dataclass
class PythonTool:
  """`python`: runs {"code": ...} in the code sandbox (sandbox/jobs.py, namespaces
  isolation with the seccomp filter) and returns its stdout, or the exception it raised;
  both cut to `max_output_chars`. Each call gets at most `timeout_s`."""
  name: str = "python"
  description: str = "Runs Python code and returns what it prints: {\"code\": \"print(2**10)\"}"
  timeout_s: float = 5.0
  memory_mb: int = 256
  max_output_chars: int = 1000

  def __call__(self, arguments: Mapping[str, Any]) -> str:
    code = _string_argument(arguments, "code", self.name)
    limits = sandbox.Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                            output_bytes=max(4 * self.max_output_chars, 4096))
    outcome = sandbox.run_job({"mode": "io", "program": code, "inputs": [""]}, limits)
    if outcome.report is None:
      raise ToolError(outcome.failure or "the program died")
    outputs, errors = outcome.report.get("outputs") or [""], outcome.report.get("errors") or [""]
    text = str(outputs[0]) + (f"error: {errors[0]}" if errors[0] else "")
    if len(text) > self.max_output_chars:
      text = text[:self.max_output_chars] + f"... [cut at {self.max_output_chars} characters]"
    return text


class ToolEnvironment:
  """An Environment that runs the tool calls of each model turn (see the module docstring).

  Args:
    tools: the tools by their names.
    max_calls_per_turn: calls beyond this in one turn get an error line.
    time_budget_s: the episode's total time in tools; a call after it is spent gets an
      error line.
    pattern: the tool-call form (`TOOL_CALL`: Qwen2.5 / Hermes).
  """

  def __init__(self, tools: Sequence[Tool], *, max_calls_per_turn: int = 4,
               time_budget_s: float = 30.0, pattern: re.Pattern = TOOL_CALL):
    self.tools = {tool.name: tool for tool in tools}
    self.max_calls_per_turn = max_calls_per_turn
    self.time_budget_s = time_budget_s
    self.pattern = pattern
    self.spent_s = 0.0

  def reset(self, example) -> str:
    """No first observation: the prompt says what to do."""
    del example
    self.spent_s = 0.0
    return ""

  def step(self, action: str) -> StepResult:
    """Runs the turn's calls; no call ends the episode."""
    calls = parse_tool_calls(action, self.pattern)
    if not calls:
      return StepResult(done=True, info={"tool_calls": 0})
    lines, errors = [], 0
    for number, call in enumerate(calls):
      line = self._run(call, number).rstrip("\n")
      errors += line.startswith("error: ")
      lines.append(line)
    return StepResult(observation="\n".join(lines), role="tool",
                      info={"tool_calls": len(calls), "tool_errors": errors})

  def _run(self, call: ToolCall | str, number: int) -> str:
    """One call's result line."""
    if isinstance(call, str):
      return f"error: {call}"
    if number >= self.max_calls_per_turn:
      return f"error: at most {self.max_calls_per_turn} tool calls per turn"
    tool = self.tools.get(call.name)
    if tool is None:
      return f"error: unknown tool {call.name!r} (tools: {', '.join(sorted(self.tools))})"
    if self.spent_s >= self.time_budget_s:
      return f"error: the episode's tool time ({self.time_budget_s:g} s) is spent"
    started = time.perf_counter()
    try:
      return tool(call.arguments)
    except ToolError as error:
      return f"error: {error}"
    finally:
      self.spent_s += time.perf_counter() - started


def calculator_environment() -> ToolEnvironment:
  """`env.factory` "rlhf_jax.envs.tools:calculator_environment": the calculator."""
  return ToolEnvironment([Calculator()])


def python_environment() -> ToolEnvironment:
  """`env.factory` "rlhf_jax.envs.tools:python_environment": python and the calculator."""
  return ToolEnvironment([PythonTool(), Calculator()])
