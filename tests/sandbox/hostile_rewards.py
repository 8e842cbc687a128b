"""Hostile reward functions in TRL's signature, for tests/sandbox/test_workers.py
(module-level: they run in the reward-function worker processes)."""

import os
import subprocess
import time


def leaves_a_process(prompts, completions, **kwargs):
  """Starts a process that would outlive the call, and reports its pid as the reward."""
  child = subprocess.Popen(["sleep", "300"])
  return [float(child.pid)] * len(completions)


def leaves_a_process_and_hangs(prompts, completions, **kwargs):
  """Starts a process, writes its pid where the test finds it, then hangs past the
  deadline: the worker is killed, and its group with it."""
  child = subprocess.Popen(["sleep", "300"])
  with open(os.environ["HOSTILE_PID_FILE"], "w", encoding="utf-8") as f:
    f.write(str(child.pid))
  time.sleep(300)
  return [0.0] * len(completions)


def eats_memory(prompts, completions, **kwargs):
  """Holds ever more memory (1.5 GB at most), touching every page."""
  held = []
  for _ in range(60):
    held.append(bytearray(25 * 2**20))
    time.sleep(0.02)
  return [0.0] * len(completions)


class _Payload:
  """An object whose unpickling runs a command (as a crafted pickle would)."""

  def __reduce__(self):
    return (os.system, (f"touch {os.environ['HOSTILE_MARKER']}",))


def forged_result(prompts, completions, **kwargs):
  """Returns objects that would run a command in whichever process unpickled them."""
  return [_Payload() for _ in completions]


class _FloatPayload(float):
  """A number that carries the same payload when pickled."""

  def __reduce__(self):
    return (os.system, (f"touch {os.environ['HOSTILE_MARKER']}",))


def forged_numbers(prompts, completions, **kwargs):
  return [_FloatPayload(1.0) for _ in completions]


def floods_stdout(prompts, completions, **kwargs):
  """50 MB to stdout, from the worker and from a child process."""
  os.write(1, b"y" * (25 * 2**20))
  subprocess.run(["head", "-c", str(25 * 2**20), "/dev/zero"], check=True)
  return [1.0] * len(completions)


def _parent_connection():
  """The worker's pipe to the trainer, found where user code can find it: up the stack."""
  import sys  # pylint: disable=import-outside-toplevel
  frame = sys._getframe()  # pylint: disable=protected-access
  while frame is not None:
    if "connection" in frame.f_locals and hasattr(frame.f_locals["connection"], "send_bytes"):
      return frame.f_locals["connection"]
    frame = frame.f_back
  raise RuntimeError("no connection found")


def writes_garbage_to_its_pipe(prompts, completions, **kwargs):
  """Sends bytes that are not the worker's reply before returning normally."""
  _parent_connection().send_bytes(b"\x80\x04not json at all")
  return [1.0] * len(completions)
