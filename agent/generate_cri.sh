#!/bin/sh
# Regenerates the agent's gRPC stubs: cri_pb2.py, cri_pb2.pyi and cri_pb2_grpc.py from agent/cri.proto,
# and containerd_events_pb2* and containerd_images_pb2* from their .proto files.
# Use grpcio-tools 1.49.1 (PYTHON picks the interpreter that has it; default: python): the oldest
# generator with Python 3.11 wheels. Its stubs check no runtime version and need only protobuf's
# builder (3.20) and grpcio's channel API, so the agent runs beside a training stack's pins
# (protobuf>=3.20.3, grpcio>=1.49.1, up to today's releases; tests/packaging/test_packaging.py checks both ends).
set -eu
cd "$(dirname "$0")/.."
"${PYTHON:-python}" -c 'import grpc_tools, importlib.metadata as m; v = m.version("grpcio-tools"); assert v == "1.49.1", f"grpcio-tools {v}, not 1.49.1"'
for name in cri containerd_events containerd_images; do
    "${PYTHON:-python}" -m grpc_tools.protoc -I agent --python_out=agent --pyi_out=agent --grpc_python_out=agent "agent/$name.proto"
    # protoc writes a top-level "import <name>_pb2"; the stubs live in the agent package.
    alias="$(printf '%s' "$name" | sed 's/_/__/g')__pb2"
    sed -i "s/^import ${name}_pb2 as ${alias}\$/from image_preflight.agent import ${name}_pb2 as ${alias}/" "agent/${name}_pb2_grpc.py"
    grep -q "^from image_preflight.agent import ${name}_pb2 as ${alias}\$" "agent/${name}_pb2_grpc.py"
done
