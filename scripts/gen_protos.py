"""Regenerates rlhf_jax/sampling/serve/protos/*_pb2*.py from the .proto files.

Needs grpcio-tools (`pip install grpcio-tools`); the generated modules are committed,
so users and CI need only grpcio and protobuf.

  python scripts/gen_protos.py
"""

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROTOS = sorted((ROOT / "rlhf_jax" / "sampling" / "serve" / "protos").glob("*.proto"))

for proto in PROTOS:
  status = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}",
                        f"--grpc_python_out={ROOT}", str(proto.relative_to(ROOT))])
  if status:
    sys.exit(f"protoc failed on {proto}")
  print(f"generated from {proto.relative_to(ROOT)}")
