"""Python modules generated from .proto files by grpc_tools.protoc, and the tost.v1 ones of a source
checkout, generated from the repository's proto/ on first import.

Generated code is tied to the protobuf runtime that imports it, so nothing generated is committed:
the first import runs grpc_tools.protoc (from `pip install grpcio-tools`) on
proto/tost/v1/tost.proto into a cache directory keyed by the proto's SHA-256 and the grpcio-tools
version, and later imports reuse it. Where the proto is and where the cache goes can be set:

  TOST_PROTO_DIR         the directory holding tost/v1/tost.proto (default: the repository's proto/,
                         found from this file's place in client/python/tost_client/)
  TOST_CLIENT_CACHE_DIR  where generated modules are kept (default: $XDG_CACHE_HOME/tost_client or
                         ~/.cache/tost_client; a temporary directory when neither is writable)

The one protoc run of the project's Python: run_protoc (into a directory) and generate_cached (into
a cache directory named by the protos' contents). Standard library only and no relative imports, so
that setup.py (the wheel's build step) and the repository's tools/pylib/tost_protos.py load this
file by its path: the package needs nothing outside itself, and the repository reuses it.
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


def run_protoc(root: str, protos, out: str, grpc: bool = True, pyi: bool = False,
               descriptor_set: str = "") -> None:
    """Generates the Python modules of `protos` (paths relative to `root`, which is the import path
    they are compiled against) into `out`: *_pb2.py, with `grpc` *_pb2_grpc.py, with `pyi` *_pb2.pyi;
    with `descriptor_set`, also a FileDescriptorSet of them and their imports at that path.
    Raises RuntimeError when protoc fails."""
    import grpc_tools  # noqa: PLC0415 - only needed when generating
    from grpc_tools import protoc  # noqa: PLC0415

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    argv = ["protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}"]
    if grpc:
        argv.append(f"--grpc_python_out={out}")
    if pyi:
        argv.append(f"--pyi_out={out}")
    if descriptor_set:
        argv += [f"--descriptor_set_out={descriptor_set}", "--include_imports"]
    files = [os.path.join(root, p) for p in protos]
    rc = protoc.main(argv + files)
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed (exit status {rc}) on {' '.join(files)}")


def _tools_version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("grpcio-tools")
    except Exception:  # noqa: BLE001 - any failure only makes the cache key less specific
        return "unknown"


def generate_cached(root: str, protos, cache_root: str, descriptor_set: bool = False) -> str:
    """The directory holding the modules of `protos` (as run_protoc generates them, with gRPC
    stubs; with `descriptor_set`, also descriptors.pb): <cache_root>/<key>, where the key hashes the
    protos' names and contents, the grpcio-tools version and the options. Generated once: into a
    temporary directory beside it, then renamed into place, so concurrent first users (test
    processes, several processes of one deployment) never see a half-written directory and reruns
    reuse it. A cache_root that cannot be written is replaced by one in the temporary directory.
    Raises OSError when a proto cannot be read, RuntimeError when protoc fails."""
    h = hashlib.sha256()
    for p in protos:
        with open(os.path.join(root, p), "rb") as f:
            h.update(p.encode() + b"\0" + f.read() + b"\0")
    h.update(f"grpcio-tools {_tools_version()}; descriptor_set={descriptor_set}".encode())
    key = h.hexdigest()[:16]
    if not _writable_dir(cache_root):
        cache_root = os.path.join(tempfile.gettempdir(), f"{os.path.basename(cache_root)}-{os.getuid()}")
        os.makedirs(cache_root, exist_ok=True)
    out = os.path.join(cache_root, key)
    if not os.path.isdir(out):
        staging = tempfile.mkdtemp(prefix=f"{key}.", dir=cache_root)
        try:
            run_protoc(root, protos, staging,
                       descriptor_set=os.path.join(staging, "descriptors.pb") if descriptor_set else "")
            os.chmod(staging, 0o755)  # mkdtemp's 0700 would keep it from others sharing the cache
            try:
                os.rename(staging, out)
            except OSError:
                if not os.path.isdir(out):  # not another process's rename first
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def load():
    """Returns (tost_pb2, tost_pb2_grpc), generating them first if the cache lacks them."""
    src = proto_dir()
    if not os.path.isfile(os.path.join(src, _PROTO_RELATIVE)):
        raise ImportError(f"tost_client needs {_PROTO_RELATIVE} under {src} (set TOST_PROTO_DIR)")
    try:
        out = generate_cached(src, [_PROTO_RELATIVE], _cache_root())
    except (OSError, RuntimeError) as e:
        raise ImportError(f"tost_client could not generate its modules from {src}: {e}") from e
    if out not in sys.path:
        sys.path.insert(0, out)
    # The generated tost_pb2_grpc imports `tost.v1.tost_pb2`; a copy already imported (by another
    # generator of the same proto) is reused, as the descriptor pool holds one tost.v1.
    from tost.v1 import tost_pb2, tost_pb2_grpc  # noqa: PLC0415

    return tost_pb2, tost_pb2_grpc
