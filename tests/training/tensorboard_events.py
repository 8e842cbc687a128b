"""Reading TensorBoard event files in tests (no TensorFlow)."""

import struct


def read_event_scalars(directory):
  """(tag, step, value) of every scalar in the TFRecord event files of `directory`."""
  from tensorboardX.proto import event_pb2

  out = []
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        out.append((value.tag, event.step, value.simple_value))
  return out
