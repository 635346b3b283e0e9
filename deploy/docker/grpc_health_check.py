#!/usr/bin/env python3
"""grpc.health.v1 Check against tost_server: exit 0 when it answers SERVING, 1 otherwise.

  tost_health_check [--address=127.0.0.1:8500] [--service=] [--timeout_s=3]
                    [--tls_ca=CA.pem --server_name=NAME]

The images' HEALTHCHECK, and the Kubernetes exec probe when gRPC is served over TLS (the kubelet's
own gRPC probe speaks plaintext only). Needs only python3-grpcio: the request and the response are
encoded by hand (HealthCheckRequest is field 1 `service`, a string; HealthCheckResponse is field 1
`status`, an enum, SERVING = 1), so no generated stubs have to be shipped."""
import argparse
import sys

import grpc

STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service):
    data = service.encode()
    if len(data) > 127:
        raise ValueError("service name longer than 127 bytes")
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def decode_status(response):
    # Proto3 omits a zero enum, so an empty message is UNKNOWN.
    i, status = 0, 0
    while i < len(response):
        key = response[i]
        i += 1
        if key == 0x08:  # field 1, varint
            status, shift = 0, 0
            while True:
                b = response[i]
                i += 1
                status |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
        else:
            raise ValueError(f"unexpected field key {key:#x} in HealthCheckResponse")
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="127.0.0.1:8500")
    p.add_argument("--service", default="", help="service name to check; empty: the whole server")
    p.add_argument("--timeout_s", type=float, default=3.0)
    p.add_argument("--tls_ca", help="PEM CA that signed the server's certificate: connect over TLS")
    p.add_argument("--server_name", help="name to verify the server's certificate against (with --tls_ca)")
    a = p.parse_args()
    if a.tls_ca:
        with open(a.tls_ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = [("grpc.ssl_target_name_override", a.server_name)] if a.server_name else []
        channel = grpc.secure_channel(a.address, creds, options=options)
    else:
        channel = grpc.insecure_channel(a.address)
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    try:
        status = decode_status(check(encode_request(a.service), timeout=a.timeout_s))
    except grpc.RpcError as e:
        print(f"tost_health_check: {a.address}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    print(f"tost_health_check: {a.address}: {STATUS.get(status, status)}")
    return 0 if status == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
