"""The Python modules of the repository's protos, for the tests, the benchmarks and the tools:
tost.v1 (proto/tost/v1/tost.proto), the session blob's payload tost.v1.internal.SessionState
(proto/tost/v1/session_state.proto) and KServe v2 (proto/kserve/v2/grpc_service.proto, package
`inference`).

    import tost_protos
    tost_pb2, tost_pb2_grpc = tost_protos.tost()
    session_state_pb2 = tost_protos.session_state()
    grpc_service_pb2, grpc_service_pb2_grpc = tost_protos.kserve()
    fds = tost_protos.descriptor_set()  # a FileDescriptorSet of the three, nothing imported

All three are generated together, by one grpc_tools.protoc run, into a cache directory keyed by the
protos' contents and the grpcio-tools version, written to a temporary directory beside it and
renamed into place: concurrent test processes and reruns share one copy, and none sees a
half-written one. The generator is the tost-client package's (client/python/tost_client/_stubs.py,
loaded by its path): the pip package stays free of repository imports, and this module reuses it.
The cache is $TOST_PROTO_CACHE_DIR, else $XDG_CACHE_HOME/tost-serve/protos (~/.cache/...), else one
in the temporary directory when that cannot be written.

The generated directory goes on sys.path (the modules import each other as `tost.v1...`). KServe's
modules define package `inference`, as tritonclient's do: a process that imported tritonclient's
cannot import ours (the descriptor pool refuses the same names twice); descriptor_set() reads them
without importing.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PROTO_DIR = os.path.join(ROOT, "proto")
TOST = "tost/v1/tost.proto"
SESSION_STATE = "tost/v1/session_state.proto"
KSERVE = "kserve/v2/grpc_service.proto"
PROTOS = (TOST, SESSION_STATE, KSERVE)


def cache_root() -> str:
    configured = os.environ.get("TOST_PROTO_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tost-serve", "protos")


@functools.lru_cache(maxsize=None)
def _generator():
    """client/python/tost_client/_stubs.py as a module of its own (not the tost_client package)."""
    path = os.path.join(ROOT, "client", "python", "tost_client", "_stubs.py")
    spec = importlib.util.spec_from_file_location("tost_protos_generator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def generated_dir() -> str:
    """The directory with the generated modules (and descriptors.pb), generated first if the cache
    lacks it; put on sys.path."""
    out = _generator().generate_cached(PROTO_DIR, PROTOS, cache_root(), descriptor_set=True)
    if out not in sys.path:
        sys.path.insert(0, out)
    return out


def _modules(*names):
    generated_dir()
    return tuple(importlib.import_module(n) for n in names)


def tost():
    """(tost_pb2, tost_pb2_grpc): the tost.v1 messages and the Tost service's stub and servicer."""
    return _modules("tost.v1.tost_pb2", "tost.v1.tost_pb2_grpc")


def session_state():
    """session_state_pb2: tost.v1.internal.SessionState, the payload of a session blob."""
    return _modules("tost.v1.session_state_pb2")[0]


def kserve():
    """(grpc_service_pb2, grpc_service_pb2_grpc): KServe v2's messages and GRPCInferenceService."""
    return _modules("kserve.v2.grpc_service_pb2", "kserve.v2.grpc_service_pb2_grpc")


def descriptor_set():
    """A google.protobuf FileDescriptorSet of the three protos and what they import (by file name:
    `tost/v1/tost.proto`, ...), read from the cache without importing any generated module."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    with open(os.path.join(generated_dir(), "descriptors.pb"), "rb") as f:
        fds.ParseFromString(f.read())
    return fds
