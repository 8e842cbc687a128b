"""Tools (envs/tools.py): the Hermes tool-call parser, the calculator against Python's own
integer arithmetic, the python tool in the sandbox, and a ToolEnvironment that answers bad
calls with error lines instead of raising."""

import json

import pytest

from rlhf_jax.envs import StepResult
from rlhf_jax.envs.tools import Calculator
from rlhf_jax.envs.tools import PythonTool
from rlhf_jax.envs.tools import ToolCall
from rlhf_jax.envs.tools import ToolEnvironment
from rlhf_jax.envs.tools import ToolError
from rlhf_jax.envs.tools import parse_tool_calls


def call(name, **arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_calls_are_parsed_in_order_and_malformed_ones_say_why():
  text = ("Let me compute. " + call("calculator", expression="2*3") + " and "
          + call("python", code="print(1)") + "<tool_call>{not json}</tool_call>"
          + '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}'
          "</tool_call><tool_call>{\"arguments\": {}}</tool_call>"
          '<tool_call>{"name": "x", "arguments": [1]}</tool_call>')
  parsed = parse_tool_calls(text)
  assert parsed[:2] == [ToolCall("calculator", {"expression": "2*3"}),
                        ToolCall("python", {"code": "print(1)"})]
  assert parsed[2].startswith("the tool call is not JSON")
  assert parsed[3] == ToolCall("calculator", {"expression": "1+1"})  # arguments as a string
  assert parsed[4] == 'a tool call needs {"name": str, "arguments": {...}}'
  assert parsed[5] == "the arguments of 'x' must be a JSON object"
  assert parse_tool_calls("no calls here") == []


@pytest.mark.parametrize("expression", ["123456 * 789012", "-(17 - 40) // 3", "2 ** 100 % 97",
                                        "(1 + 2) * 3 - 4 / 8", "987654321 * 123456789"])
def test_the_calculator_agrees_with_python(expression):
  assert Calculator()({"expression": expression}) == str(eval(expression))  # trusted literals


@pytest.mark.parametrize("expression, message", [
    ("__import__('os')", "not Call"), ("x + 1", "not Name"), ("1 / 0", "division by zero"),
    ("9 ** 9 ** 9", "more than 200 digits"), ("1 +", "cannot parse"),
    ("'a' * 3", "not Constant")])
def test_the_calculator_refuses_what_is_not_arithmetic(expression, message):
  with pytest.raises(ToolError, match=message):
    Calculator()({"expression": expression})


def test_an_environment_answers_every_call_and_never_raises():
  env = ToolEnvironment([Calculator()], max_calls_per_turn=3)
  assert env.reset(None) == ""
  result = env.step(call("calculator", expression="6*7") + call("search", q="x")
                    + "<tool_call>[</tool_call>" + call("calculator", expression="1"))
  assert result == StepResult(
      observation="42\nerror: unknown tool 'search' (tools: calculator)\nerror: the tool call "
      "is not JSON: Expecting value at character 1\nerror: at most 3 tool calls per turn",
      role="tool", info={"tool_calls": 4, "tool_errors": 3})
  assert env.step(call("calculator", expression=7)).observation == (
      "error: calculator needs a string argument 'expression'")
  assert env.step("The answer is 42.") == StepResult(done=True, info={"tool_calls": 0})


def test_the_python_tool_runs_in_the_sandbox_and_cuts_its_output():
  tool = PythonTool(max_output_chars=20, timeout_s=5.0)
  assert tool({"code": "print(sum(range(10)))"}) == "45\n"
  assert tool({"code": "print('x' * 100)"}) == "x" * 20 + "... [cut at 20 characters]"
  assert "ZeroDivisionError" in PythonTool()({"code": "1 / 0"})
  assert "error" in tool({"code": "import socket; socket.create_connection(('1.1.1.1', 80))"})
  with pytest.raises(ToolError, match="timeout"):
    PythonTool(timeout_s=1.0)({"code": "while True: pass"})


def test_a_spent_time_budget_refuses_further_calls():
  # the call's timeout is far past its 0.6 s: a loaded machine starts the sandbox slowly
  env = ToolEnvironment([PythonTool(timeout_s=30.0)], time_budget_s=0.5)
  first = env.step(call("python", code="import time; time.sleep(0.6); print('ok')"))
  assert first.observation == "ok"  # a result's trailing newline is dropped
  assert env.step(call("python", code="print(1)")).observation == (
      "error: the episode's tool time (0.5 s) is spent")
