#!/bin/sh
# Regenerates agent/cri_pb2.py, cri_pb2.pyi and cri_pb2_grpc.py from agent/cri.proto.
# Needs grpcio-tools; PYTHON picks the interpreter (default: python).
set -eu
cd "$(dirname "$0")/.."
"${PYTHON:-python}" -m grpc_tools.protoc -I agent --python_out=agent --pyi_out=agent --grpc_python_out=agent agent/cri.proto
# protoc writes a top-level "import cri_pb2"; the stubs live in the agent package.
sed -i 's/^import cri_pb2 as cri__pb2$/from image_preflight.agent import cri_pb2 as cri__pb2/' agent/cri_pb2_grpc.py
grep -q '^from image_preflight.agent import cri_pb2 as cri__pb2$' agent/cri_pb2_grpc.py
