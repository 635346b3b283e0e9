"""The exception every call of tost_client raises for a failed RPC."""
from typing import Optional

import grpc


class TostError(Exception):
    """A tost.v1 call failed. `code` is its grpc.StatusCode (None only for failures the client
    itself detects without a status, e.g. a resumable generation's ProtocolError), `message` the
    server's (or the client's) description."""

    def __init__(self, code: Optional[grpc.StatusCode], message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}" if self.code is not None else self.message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "TostError":
        """The TostError of a grpc.RpcError (sync or grpc.aio)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code, details or "")
