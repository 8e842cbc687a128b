"""configs/serve.py's tiny server config, shared by the server tests."""

import importlib.util
import pathlib


def serve_config(variant="tiny"):
  """configs/serve.py:<variant> (tiny or hf)."""
  path = pathlib.Path(__file__).resolve().parents[2] / "configs" / "serve.py"
  spec = importlib.util.spec_from_file_location("serve_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)
