"""The tost.v1 modules: generated into the package when its wheel was built (`pip install
./client/python`), or, for a checkout used from source (client/python on PYTHONPATH), generated
from the repository's proto/ on first import by tost_client._stubs."""
import importlib.util

if importlib.util.find_spec(f"{__package__}.tost_pb2") is not None:
    from . import tost_pb2, tost_pb2_grpc
else:  # pragma: no cover - a source checkout
    from ._stubs import load

    tost_pb2, tost_pb2_grpc = load()

__all__ = ["tost_pb2", "tost_pb2_grpc"]
