"""The tost.v1 protobuf and gRPC modules, generated from the repository's proto/ on first import.

Generated code is tied to the protobuf runtime that imports it, so nothing generated is committed:
the first import runs grpc_tools.protoc (from `pip install grpcio-tools`) on
proto/tost/v1/tost.proto into a cache directory keyed by the proto's SHA-256 and the grpcio-tools
version, and later imports reuse it. Where the proto is and where the cache goes can be set:

  TOST_PROTO_DIR         the directory holding tost/v1/tost.proto (default: the repository's proto/,
                         found from this file's place in client/python/tost_client/)
  TOST_CLIENT_CACHE_DIR  where generated modules are kept (default: $XDG_CACHE_HOME/tost_client or
                         ~/.cache/tost_client; a temporary directory when neither is writable)
"""
import hashlib
import os
import shutil
import sys
import tempfile

_PROTO_RELATIVE = os.path.join("tost", "v1", "tost.proto")


def proto_dir() -> str:
    configured = os.environ.get("TOST_PROTO_DIR")
    if configured:
        return configured
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "proto"))


def _cache_root() -> str:
    configured = os.environ.get("TOST_CLIENT_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tost_client")


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        return os.access(path, os.W_OK)
    except OSError:
        return False


def _generate(src: str, out: str) -> None:
    from grpc_tools import protoc  # noqa: PLC0415 - only needed the first time

    import grpc_tools  # noqa: PLC0415

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{src}", f"-I{well_known}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(src, _PROTO_RELATIVE)])
    if rc != 0:
        raise ImportError(f"grpc_tools.protoc failed (exit status {rc}) on {os.path.join(src, _PROTO_RELATIVE)}")


def load():
    """Returns (tost_pb2, tost_pb2_grpc), generating them first if the cache lacks them."""
    src = proto_dir()
    proto = os.path.join(src, _PROTO_RELATIVE)
    try:
        with open(proto, "rb") as f:
            contents = f.read()
    except OSError as e:
        raise ImportError(f"tost_client needs {_PROTO_RELATIVE} under {src} (set TOST_PROTO_DIR): {e}") from e
    try:
        from importlib.metadata import version  # noqa: PLC0415

        tools_version = version("grpcio-tools")
    except Exception:  # noqa: BLE001 - any failure only makes the cache key less specific
        tools_version = "unknown"
    key = hashlib.sha256(contents + tools_version.encode()).hexdigest()[:16]
    root = _cache_root()
    if not _writable_dir(root):
        root = os.path.join(tempfile.gettempdir(), f"tost_client-{os.getuid()}")
        os.makedirs(root, exist_ok=True)
    out = os.path.join(root, key)
    if not os.path.exists(os.path.join(out, "tost", "v1", "tost_pb2_grpc.py")):
        # Generated beside the final place and renamed into it: concurrent first imports (test
        # workers, several processes of one deployment) never see a half-written package.
        staging = tempfile.mkdtemp(prefix=f"{key}.", dir=root)
        try:
            _generate(src, staging)
            try:
                os.rename(staging, out)
            except OSError:
                if not os.path.exists(os.path.join(out, "tost", "v1", "tost_pb2_grpc.py")):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if out not in sys.path:
        sys.path.insert(0, out)
    # The generated tost_pb2_grpc imports `tost.v1.tost_pb2`; a copy already imported (by another
    # generator of the same proto) is reused, as the descriptor pool holds one tost.v1.
    from tost.v1 import tost_pb2, tost_pb2_grpc  # noqa: PLC0415

    return tost_pb2, tost_pb2_grpc
