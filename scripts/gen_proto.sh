#!/usr/bin/env bash
# Regenerate the checked-in protobuf/gRPC modules after editing a .proto file.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. system/kv/proto/*.proto system/trainer/proto/*.proto \
    nemesis/systems/etcd/proto/*.proto
