"""KServe v2 / Open Inference Protocol: the unmodified tritonclient gRPC client (PyPI) against the real
tost_server, plus our proto checked message by message against the one tritonclient ships."""
import json
import os
import struct
import zlib

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import SOURCE_DIR, RunningServer
import tost_protos  # tools/pylib, on sys.path once conftest is imported

MODEL = "tost-digits"
LM = "tost-austen"


def _vision():
    with open(os.path.join(SOURCE_DIR, "models", MODEL, "config.json")) as f:
        cfg = json.load(f)
    return cfg["vision"], cfg["preprocess"], cfg["labels"]


def encode_png(pixels: np.ndarray) -> bytes:
    """A minimal PNG encoder (8-bit gray HxW or RGB HxWx3), so the test needs no imaging package."""
    h, w = pixels.shape[:2]
    colour_type = 2 if pixels.ndim == 3 else 0
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour_type, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def reference_preprocess(rgb: np.ndarray, mode="bilinear") -> np.ndarray:
    """The documented pipeline (imaging/image_decode.h) for the gray digits model: BT.601 luma
    in the 16-bit fixed point of PIL/libjpeg, /255, antialiased bilinear resize (torch),
    (x - mean) / std."""
    v, pre, _ = _vision()
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    luma = ((19595 * r + 38470 * g + 7471 * b + 32768) >> 16).astype(np.float32) / 255.0
    x = torch.from_numpy(luma)[None, None]
    if mode == "bilinear":
        x = torch.nn.functional.interpolate(x, size=(v["image_height"], v["image_width"]), mode="bilinear",
                                            antialias=True, align_corners=False)
    else:
        x = torch.nn.functional.interpolate(x, size=(v["image_height"], v["image_width"]), mode=mode)
    return ((x[0] - pre["mean"][0]) / pre["std"][0]).numpy().astype(np.float32)  # [1, H, W]


def random_rgb(seed, h=45, w=37):
    rng = np.random.default_rng(seed)
    # Smooth structure plus noise, so resizing matters.
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (h + w)], axis=-1)
    return np.clip(base + rng.integers(-40, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def client(server):
    c = triton.InferenceServerClient(url=server.address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def raw_stub(channel):
    """tritonclient's own generated stub, for requests its high-level API refuses to build."""
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _fp32_input(x):
    inp = triton.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def infer_fp32(client, x, outputs=None):
    return client.infer(MODEL, [_fp32_input(x)], outputs=outputs)


def infer_bytes(client, images, outputs=None):
    inp = triton.InferInput("image_bytes", [len(images)], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=np.object_))
    return client.infer(MODEL, [inp], outputs=outputs)


def test_proto_matches_the_published_spec():
    """Every message, field (name, number, type, label, oneof) and RPC of proto/kserve/v2 equals its
    counterpart in tritonclient's grpc_service.proto descriptor."""
    from google.protobuf import descriptor_pb2

    # Read from the descriptor set: importing our modules would clash with tritonclient's (both
    # define package `inference`).
    (ours,) = [f for f in tost_protos.descriptor_set().file if f.name == tost_protos.KSERVE]
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    assert ours.package == theirs.package == "inference"

    def fields(m):
        return {f.name: (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1],
                         m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None) for f in m.field}

    def compare(a, b, path):
        assert fields(a) == fields(b), path
        nested = {n.name: n for n in b.nested_type}
        for n in a.nested_type:
            assert n.name in nested, f"{path}.{n.name}"
            compare(n, nested[n.name], f"{path}.{n.name}")

    spec = {m.name: m for m in theirs.message_type}
    for m in ours.message_type:
        assert m.name in spec, m.name
        compare(m, spec[m.name], m.name)
    spec_rpcs = {r.name: r for r in next(s for s in theirs.service if s.name == "GRPCInferenceService").method}
    (service,) = ours.service
    assert service.name == "GRPCInferenceService"
    assert {r.name for r in service.method} == {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
                                                "ModelMetadata", "ModelInfer"}
    for r in service.method:
        s = spec_rpcs[r.name]
        assert (r.input_type, r.output_type, r.client_streaming, r.server_streaming) == \
            (s.input_type, s.output_type, s.client_streaming, s.server_streaming), r.name


def test_server_live_ready_and_metadata(client, channel):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "tost-serve"
    assert meta.version
    assert list(meta.extensions) == ["classification"]


def test_model_ready_and_metadata(client):
    v, _, _ = _vision()
    assert client.is_model_ready(MODEL)
    assert client.is_model_ready(LM)
    meta = client.get_model_metadata(MODEL)
    assert meta.name == MODEL and meta.platform == "tost_vision" and len(meta.versions) == 1
    inputs = {t.name: (t.datatype, list(t.shape)) for t in meta.inputs}
    assert inputs == {"image": ("FP32", [-1, v["in_chans"], v["image_height"], v["image_width"]]),
                      "image_bytes": ("BYTES", [-1])}
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == \
        [("probabilities", "FP32", [-1, v["num_classes"]])]
    with pytest.raises(InferenceServerException) as e:
        client.is_model_ready(MODEL, model_version="no-such-version")
    assert e.value.status() == "StatusCode.NOT_FOUND" and "no-such-version" in e.value.message()
    lm = client.get_model_metadata(LM)
    assert lm.platform == "tost_lm" and not lm.inputs


def test_infer_fp32_matches_tost_v1_classify(client, stub, proto_modules):
    pb2, _ = proto_modules
    v, _, _ = _vision()
    x = np.random.default_rng(3).standard_normal((3, v["in_chans"], v["image_height"], v["image_width"])).astype(np.float32)
    result = client.infer(MODEL, [_fp32_input(x)], request_id="req-7")
    probs = result.as_numpy("probabilities")
    assert probs.shape == (3, v["num_classes"]) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    response = result.get_response()
    assert response.model_name == MODEL and response.id == "req-7" and response.model_version
    ours = stub.Classify(pb2.ClassifyRequest(model=MODEL, tensor=pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes()),
                                             top_k=v["num_classes"]))
    for b, res in enumerate(ours.results):
        for label in res.labels:
            assert abs(probs[b, label.index] - label.probability) < 1e-6


def test_infer_fp32_via_typed_contents_equals_raw(client, raw_stub):
    v, _, _ = _vision()
    x = np.random.default_rng(4).standard_normal((1, v["in_chans"], v["image_height"], v["image_width"])).astype(np.float32)
    raw = infer_fp32(client, x).as_numpy("probabilities")
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    t = req.inputs.add(name="image", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.reshape(-1).tolist())
    resp = raw_stub.ModelInfer(req, timeout=30)
    typed = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(raw.shape)
    np.testing.assert_array_equal(typed, raw)


def test_infer_png_bytes_is_preprocessed_as_documented(client):
    images = [random_rgb(10), random_rgb(11, h=20, w=64), random_rgb(12, h=32, w=32)]
    got = infer_bytes(client, [encode_png(im) for im in images]).as_numpy("probabilities")
    want = infer_fp32(client, np.stack([reference_preprocess(im) for im in images])).as_numpy("probabilities")
    assert got.shape == want.shape == (3, 10)
    np.testing.assert_allclose(got, want, atol=1e-6)
    # The comparison is sensitive: a differently resized image moves the probabilities far more.
    nearest = infer_fp32(client, np.stack([reference_preprocess(im, mode="nearest") for im in images]))
    assert np.abs(nearest.as_numpy("probabilities") - want).max() > 100 * 1e-6


def test_gray_png_equals_rgb_png_of_the_same_luma(client):
    rgb = random_rgb(20)
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    luma = ((19595 * r + 38470 * g + 7471 * b + 32768) >> 16).astype(np.uint8)
    a = infer_bytes(client, [encode_png(rgb)]).as_numpy("probabilities")
    b2 = infer_bytes(client, [encode_png(luma)]).as_numpy("probabilities")
    np.testing.assert_array_equal(a, b2)


def test_tost_v1_classify_accepts_encoded_images(client, stub, proto_modules):
    pb2, _ = proto_modules
    images = [encode_png(random_rgb(30)), encode_png(random_rgb(31, h=64, w=64))]
    ours = stub.Classify(pb2.ClassifyRequest(model=MODEL, images=images, top_k=10))
    probs = infer_bytes(client, images).as_numpy("probabilities")
    assert len(ours.results) == 2
    for b, res in enumerate(ours.results):
        for label in res.labels:
            assert abs(probs[b, label.index] - label.probability) < 1e-6
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(pb2.ClassifyRequest(model=MODEL, images=[b"garbage"]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "images[0]" in e.value.details()
    req = pb2.ClassifyRequest(model=MODEL, images=images, tensor=pb2.FloatTensor(shape=[1, 1, 32, 32], raw=b"\0" * 4096))
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "either tensor or images" in e.value.details()


def test_classification_extension(client):
    _, _, labels = _vision()
    x = np.random.default_rng(5).standard_normal((2, 1, 32, 32)).astype(np.float32)
    probs = infer_fp32(client, x).as_numpy("probabilities")
    result = infer_fp32(client, x, outputs=[triton.InferRequestedOutput("probabilities", class_count=3)])
    top = result.as_numpy("probabilities")
    assert top.shape == (2, 3)
    assert result.get_output("probabilities").datatype == "BYTES"
    for b in range(2):
        order = sorted(range(10), key=lambda i: (-probs[b, i], i))[:3]
        # Triton's format: std::to_string(value) ":" index ":" label.
        assert [s.decode() for s in top[b]] == ["%f:%d:%s" % (probs[b, i], i, labels[i]) for i in order]
    # More classes than the model has: all of them.
    many = infer_fp32(client, x[:1], outputs=[triton.InferRequestedOutput("probabilities", class_count=99)])
    assert many.as_numpy("probabilities").shape == (1, 10)
    # With BYTES image input too.
    png = infer_bytes(client, [encode_png(random_rgb(40))],
                      outputs=[triton.InferRequestedOutput("probabilities", class_count=1)])
    value, index, label = png.as_numpy("probabilities")[0, 0].decode().split(":")
    assert 0.0 < float(value) <= 1.0 and label == labels[int(index)]


def _code(excinfo):
    return excinfo.value.status()


def test_error_codes_through_tritonclient(client):
    x = np.zeros((1, 1, 32, 32), dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("nope", [_fp32_input(x)])
    assert _code(e) == "StatusCode.NOT_FOUND" and "not served" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert _code(e) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, [_fp32_input(x)], model_version="999")
    assert _code(e) == "StatusCode.NOT_FOUND" and "version" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer(LM, [_fp32_input(x)])
    assert _code(e) == "StatusCode.UNIMPLEMENTED" and "tost.v1.Tost/Generate" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, [_fp32_input(np.zeros((1, 1, 31, 32), dtype=np.float32))])
    assert _code(e) == "StatusCode.INVALID_ARGUMENT" and "shape" in e.value.message()


def _request(name="image", datatype="FP32", shape=(1, 1, 32, 32), raw=None):
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    if raw is not None:
        req.raw_input_contents.append(raw)
    return req


def _bytes_tensor(*elements):
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _bomb_png():
    png = bytearray(encode_png(np.zeros((2, 2), dtype=np.uint8)))
    png[16:24] = struct.pack(">II", 100000, 100000)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])) & 0xFFFFFFFF)
    return bytes(png)


F32 = b"\0" * (32 * 32 * 4)


@pytest.mark.parametrize("build,fragment", [
    (lambda: _request(raw=F32[:-4]), "raw_input_contents[0] holds 4092 bytes"),
    (lambda: _request(datatype="FP16", raw=F32), "datatype: expected FP32"),
    (lambda: _request(name="pixels", raw=F32), "no input \"pixels\""),
    (lambda: _request(shape=(1, 32, 32), raw=F32), "shape"),
    (lambda: _request(shape=(9, 1, 32, 32), raw=F32 * 9), "takes 1 to 8 images per request (--max_images_per_request), got 9"),
    (lambda: _request(shape=(0, 1, 32, 32), raw=b""), "takes 1 to 8 images per request (--max_images_per_request), got 0"),
    (lambda: _request(raw=b"\0\0\xc0\x7f" * 1024), "NaN"),
    (lambda: _request(), "fp32_contents"),
    (lambda: _request(name="image_bytes", datatype="BYTES", shape=(2,), raw=_bytes_tensor(b"a")), "holds 1 BYTES"),
    (lambda: _request(name="image_bytes", datatype="BYTES", shape=(1,), raw=b"\xff\0\0\0abc"), "declares 255 bytes"),
    (lambda: _request(name="image_bytes", datatype="BYTES", shape=(1,), raw=_bytes_tensor(b"not an image")),
     "not a PNG or JPEG"),
    (lambda: _request(name="image_bytes", datatype="BYTES", shape=(1,), raw=_bytes_tensor(_bomb_png())),
     "100000x100000 = 10000000000 pixels, more than max_decoded_pixels"),
    (lambda: _request(name="image_bytes", datatype="BYTES", shape=(1,),
                      raw=_bytes_tensor(encode_png(random_rgb(1))[:60])), "PNG"),
    (lambda: _request(name="image_bytes", datatype="FP32", shape=(1,), raw=_bytes_tensor(b"x")), "expected BYTES"),
])
def test_invalid_requests(raw_stub, build, fragment):
    with pytest.raises(grpc.RpcError) as e:
        raw_stub.ModelInfer(build(), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert fragment in e.value.details(), e.value.details()


def test_invalid_request_structure(raw_stub):
    two = _request(raw=F32)
    two.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    two.raw_input_contents.append(_bytes_tensor(b"x"))
    mixed = _request(raw=F32)
    mixed.inputs[0].contents.fp32_contents.append(1.0)
    bad_output = _request(raw=F32)
    bad_output.outputs.add(name="logits")
    bad_param = _request(raw=F32)
    bad_param.outputs.add(name="probabilities").parameters["shared_memory_region"].string_param = "r"
    zero_classes = _request(raw=F32)
    zero_classes.outputs.add(name="probabilities").parameters["classification"].int64_param = 0
    sequence = _request(raw=F32)
    sequence.parameters["sequence_id"].int64_param = 5
    for req, fragment in [(two, "exactly one input"), (mixed, "contents must be empty"), (bad_output, "no output \"logits\""),
                          (bad_param, "shared_memory_region"), (zero_classes, "must be >= 1"),
                          (sequence, "sequence parameters")]:
        with pytest.raises(grpc.RpcError) as e:
            raw_stub.ModelInfer(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (fragment, e.value.details())
        assert fragment in e.value.details(), e.value.details()


def test_failed_model_is_not_ready_with_its_error(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(os.path.join(SOURCE_DIR, "models", MODEL), repo / MODEL)
    (repo / "broken").mkdir()
    (repo / "broken" / "config.json").write_text(json.dumps({"name": "broken", "architecture": "tost_vision"}))
    s = RunningServer(str(repo))
    try:
        c = triton.InferenceServerClient(url=s.address)
        assert c.is_server_ready()
        assert c.is_model_ready(MODEL)
        assert not c.is_model_ready("broken")
        with grpc.insecure_channel(s.address) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            resp, call = stub.ModelReady.with_call(service_pb2.ModelReadyRequest(name="broken"), timeout=30)
            assert not resp.ready
            trailers = dict(call.trailing_metadata())
            assert "vision" in trailers["tost-load-error"], trailers
        with pytest.raises(InferenceServerException) as e:
            c.get_model_metadata("broken")
        assert _code(e) == "StatusCode.FAILED_PRECONDITION" and "failed to load" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.infer("broken", [_fp32_input(np.zeros((1, 1, 32, 32), dtype=np.float32))])
        assert _code(e) == "StatusCode.FAILED_PRECONDITION"
        # The healthy model still serves.
        assert c.infer(MODEL, [_fp32_input(np.zeros((1, 1, 32, 32), dtype=np.float32))]).as_numpy("probabilities").shape == (1, 10)
        c.close()
    finally:
        assert s.stop() == 0


def test_api_keys_guard_every_kserve_rpc_and_tritonclient_sends_them(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice kserve-test-key-0123456789\n")
    s = RunningServer(os.path.join(SOURCE_DIR, "models"), extra_args=[f"--api_keys_file={keys}"])
    try:
        c = triton.InferenceServerClient(url=s.address)
        x = np.zeros((1, 1, 32, 32), dtype=np.float32)
        # Every KServe RPC, the server probes included (the keyless probe is grpc.health.v1).
        for call in (lambda h: c.infer(MODEL, [_fp32_input(x)], headers=h),
                     lambda h: c.get_model_metadata(MODEL, headers=h),
                     lambda h: c.is_model_ready(MODEL, headers=h),
                     lambda h: c.is_server_live(headers=h),
                     lambda h: c.is_server_ready(headers=h),
                     lambda h: c.get_server_metadata(headers=h)):
            with pytest.raises(InferenceServerException) as e:
                call(None)
            assert _code(e) == "StatusCode.UNAUTHENTICATED"
            with pytest.raises(InferenceServerException) as e:
                call({"x-api-key": "wrong-key-wrong-key-wrong"})
            assert _code(e) == "StatusCode.UNAUTHENTICATED"
            assert call({"x-api-key": "kserve-test-key-0123456789"})
        c.close()
    finally:
        assert s.stop() == 0
