"""Build step of the tost-client wheel: generates the tost.v1 modules with grpc_tools.protoc.

The proto comes from the sdist's copy (proto/tost/v1/tost.proto next to this file, written by the
sdist command below) or, in a checkout, from the repository's proto/ (../../proto). The generated
tost_pb2.py, tost_pb2.pyi and tost_pb2_grpc.py go into the build's tost_client/ package (never into
the source tree, and nothing generated is committed); tost_pb2_grpc's absolute import of
tost.v1.tost_pb2 is made relative, so the wheel installs no top-level `tost` package. The proto's
file name stays tost/v1/tost.proto in the descriptor pool. protoc is run by the package's own
tost_client/_stubs.py (loaded by its path: the package is not importable before it is built).
"""
import importlib.util
import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("tost", "v1", "tost.proto")
GENERATED = ("tost_pb2.py", "tost_pb2.pyi", "tost_pb2_grpc.py")


def proto_root() -> str:
    for root in (os.path.join(HERE, "proto"), os.path.join(HERE, "..", "..", "proto")):  # sdist, checkout
        if os.path.isfile(os.path.join(root, PROTO)):
            return os.path.normpath(root)
    raise RuntimeError(f"tost-client: {PROTO} not found under {HERE}/proto (an sdist) nor {HERE}/../../proto "
                       "(a checkout of tost-serve)")


_generated = {}


def generated() -> dict:
    """{file name: text} of the generated modules (generated once per build process)."""
    if _generated:
        return _generated
    spec = importlib.util.spec_from_file_location("tost_client_build_stubs",
                                                  os.path.join(HERE, "tost_client", "_stubs.py"))
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    out = tempfile.mkdtemp(prefix="tost_client_build_")
    try:
        stubs.run_protoc(proto_root(), [PROTO], out, pyi=True)  # grpcio-tools: a build requirement
        for name in GENERATED:
            with open(os.path.join(out, "tost", "v1", name), encoding="utf-8") as f:
                text = f.read()
            if name == "tost_pb2_grpc.py":
                text, n = re.subn(r"^from tost\.v1 import tost_pb2 as ", "from . import tost_pb2 as ", text,
                                  flags=re.M)
                if n != 1:
                    raise RuntimeError("tost_pb2_grpc.py: the import of tost.v1.tost_pb2 was not found")
            elif name == "tost_pb2.pyi":
                # GeneratedToken has a field named `bytes`, which shadows the type inside its class
                # body (mypy: "Variable ... is not valid as a type"): every annotation names
                # builtins.bytes instead.
                text = re.sub(r"(:\s*|\[)bytes\b", r"\1_builtins.bytes", text)
                text = "import builtins as _builtins\n" + text
            _generated[name] = text
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return _generated


def install_requires() -> list:
    """grpcio >= the version that generated tost_pb2_grpc (it refuses older ones at import) and
    protobuf >= the gencode version of tost_pb2 (its runtime check refuses older ones)."""
    files = generated()
    grpc_version = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", files["tost_pb2_grpc.py"], re.M)
    gencode = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),"
                        r"\s*(\d+),", files["tost_pb2.py"])
    if not grpc_version or not gencode:
        raise RuntimeError("tost-client: the generated code names no grpcio or protobuf version "
                           "(grpcio-tools older than the build requirement?)")
    return [f"grpcio>={grpc_version.group(1)}", f"protobuf>={'.'.join(gencode.groups())}"]


class BuildPy(build_py):
    """build_py, then the generated modules into the build's tost_client/."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "tost_client")
        os.makedirs(target, exist_ok=True)
        for name, text in generated().items():
            with open(os.path.join(target, name), "w", encoding="utf-8") as f:
                f.write(text)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "tost_client", name) for name in GENERATED]


class Sdist(sdist):
    """An sdist that carries proto/tost/v1/tost.proto, so a wheel builds from it anywhere."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = os.path.join(base_dir, "proto", PROTO)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(proto_root(), PROTO), dest)


setup(install_requires=install_requires(), cmdclass={"build_py": BuildPy, "sdist": Sdist})
