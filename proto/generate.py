"""Generate the gRPC stubs for every .proto in this directory (run by the build and by `make protos`):
the messages (*_pb2.py) with their type stubs (*_pb2.pyi, protoc's own --pyi_out, so mypy checks every
message field memslice reads or writes), and the services (*_pb2_grpc.py, untyped: mypy is told to trust
calls into them, see [tool.mypy] in pyproject.toml).

protoc writes `import api_pb2` in the *_grpc modules; we rewrite that to a package-relative import so the
stubs work as `memslice.proto.*`.
"""

from __future__ import annotations

import pathlib
import sys


def generate(proto_dir: pathlib.Path) -> None:
    from grpc_tools import protoc

    for proto in sorted(proto_dir.glob("*.proto")):
        args = ["protoc", f"-I{proto_dir}", f"--python_out={proto_dir}", f"--pyi_out={proto_dir}",
                f"--grpc_python_out={proto_dir}", str(proto)]
        if protoc.main(args) != 0:
            sys.exit(f"protoc failed for {proto}")
    for stub in [*proto_dir.glob("*_pb2*.py"), *proto_dir.glob("*_pb2.pyi")]:
        lines = stub.read_text().splitlines()
        fixed = [f"from . {line}" if line.startswith("import ") and "_pb2 as " in line else line
                 for line in lines]
        stub.write_text("\n".join(fixed) + "\n")


if __name__ == "__main__":
    generate(pathlib.Path(__file__).resolve().parent)
