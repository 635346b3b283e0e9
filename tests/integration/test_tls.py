"""TLS and mutual TLS: the server presents a certificate; with --tls_client_ca_file it requires a
client certificate, whose identity then owns the sessions it creates. Certificates are made here
with the openssl command line tool."""
import os
import subprocess

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer


def _channel(server, pki, who=None):
    root = (pki / "ca.pem").read_bytes()
    if who is None:
        creds = grpc.ssl_channel_credentials(root_certificates=root)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=(pki / f"{who}.key").read_bytes(),
                                             certificate_chain=(pki / f"{who}.pem").read_bytes())
    return grpc.secure_channel(f"localhost:{server.port}", creds)


def test_mutual_tls_binds_sessions_to_the_client_certificate(pki, proto_modules):
    pb2, pb2_grpc = proto_modules
    s = RunningServer(os.path.join(SOURCE_DIR, "models"),
                      [f"--tls_cert_file={pki / 'server.pem'}", f"--tls_key_file={pki / 'server.key'}",
                       f"--tls_client_ca_file={pki / 'ca.pem'}"])
    try:
        with _channel(s, pki, "alice") as alice_ch, _channel(s, pki, "bob") as bob_ch:
            alice, bob = pb2_grpc.TostStub(alice_ch), pb2_grpc.TostStub(bob_ch)
            assert {m.name for m in alice.ListModels(pb2.ListModelsRequest(), timeout=30).models} >= {"tost-austen"}
            session = alice.CreateSession(pb2.CreateSessionRequest(model="tost-austen"), timeout=30)
            assert alice.ExportSession(pb2.SessionRef(session_id=session.session_id), timeout=30).state
            with pytest.raises(grpc.RpcError) as e:
                bob.ExportSession(pb2.SessionRef(session_id=session.session_id), timeout=30)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # No client certificate: the handshake is refused.
        with _channel(s, pki) as anonymous:
            with pytest.raises(grpc.RpcError) as e:
                pb2_grpc.TostStub(anonymous).ListModels(pb2.ListModelsRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        # Plaintext clients cannot talk to a TLS port.
        with grpc.insecure_channel(s.address) as plain:
            with pytest.raises(grpc.RpcError):
                pb2_grpc.TostStub(plain).ListModels(pb2.ListModelsRequest(), timeout=10)
    finally:
        assert s.stop() == 0


def test_tls_flags_must_come_together(pki):
    out = subprocess.run([os.environ["TOST_SERVER_BIN"], "--model_repository=" + os.path.join(SOURCE_DIR, "models"),
                          "--port=0", f"--tls_cert_file={pki / 'server.pem'}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert "--tls_cert_file and --tls_key_file must be given together" in out.stderr
