#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets: tests/fuzz/corpus/<target>/.

The seeds are committed; this script documents how they were made and remakes them
(deterministically). Run it with the project's virtual environment, which has numpy, Pillow,
protobuf and grpcio-tools:

    $(sed -n 's/^TOST_PYTHON=//p' build/deps.env) tests/fuzz/make_seeds.py

Seeds are small valid inputs and a few slightly invalid ones; the fuzzers mutate from there. A
crashing input a fuzzer finds goes in as corpus/<target>/regression-<what>, once the parser is
fixed (before that it would fail CI): this script keeps those files.
"""

import gzip
import hashlib
import hmac
import io
import json
import pathlib
import struct
import sys
import zlib

import numpy as np
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
# tests/fuzz/session_codec_fuzz.cc verifies with the same key.
SESSION_KEY = b"tost-fuzz-session-key-0123456789"

rng = np.random.default_rng(20261123)


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


# --- images ---------------------------------------------------------------------------------------
def image(mode, width, height):
    pixels = rng.integers(0, 256, size=(height, width, len(Image.new(mode, (1, 1)).getbands())))
    if mode in ("L", "P"):
        return Image.fromarray(pixels[:, :, 0].astype(np.uint8), mode="L").convert(mode)
    if mode == "I;16":
        return Image.fromarray((pixels[:, :, 0] * 257).astype(np.uint16))
    return Image.fromarray(pixels.astype(np.uint8), mode=mode)


def encode(img, fmt, **options):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width, height):
    """A PNG whose header declares width × height 8-bit gray pixels, with one row of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" + b"\x80" * min(width, 64))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) +
            png_chunk(b"IEND", b""))


def image_seeds():
    t = "image_decode"
    pngs = {
        "rgb_8x8.png": encode(image("RGB", 8, 8), "PNG"),
        "rgb_13x9.png": encode(image("RGB", 13, 9), "PNG"),
        "gray_5x3.png": encode(image("L", 5, 3), "PNG"),
        "gray_1x1.png": encode(image("L", 1, 1), "PNG"),
        "rgba_4x4.png": encode(image("RGBA", 4, 4), "PNG"),
        "gray_alpha_3x3.png": encode(image("LA", 3, 3), "PNG"),
        "palette_6x6.png": encode(image("RGB", 6, 6).convert("P", palette=Image.ADAPTIVE, colors=8),
                                  "PNG"),
        "gray16_4x4.png": encode(image("I;16", 4, 4), "PNG"),
        "bilevel_9x2.png": encode(image("L", 9, 2).convert("1"), "PNG"),
    }
    jpgs = {
        "rgb_8x8.jpg": encode(image("RGB", 8, 8), "JPEG", quality=90),
        "rgb_16x11_444.jpg": encode(image("RGB", 16, 11), "JPEG", quality=75, subsampling=0),
        "rgb_10x10_progressive.jpg": encode(image("RGB", 10, 10), "JPEG", progressive=True),
        "gray_7x5.jpg": encode(image("L", 7, 5), "JPEG"),
        "gray_1x1.jpg": encode(image("L", 1, 1), "JPEG"),
        "cmyk_4x4.jpg": encode(image("CMYK", 4, 4), "JPEG"),
    }
    for name, data in {**pngs, **jpgs}.items():
        write(t, name, data)
    write(t, "truncated.png", pngs["rgb_13x9.png"][:-30])
    jpg = jpgs["rgb_16x11_444.jpg"]
    write(t, "truncated.jpg", jpg[: len(jpg) - 40])
    damaged = bytearray(jpg)
    for i in range(len(jpg) - 60, len(jpg) - 20, 7):
        damaged[i] ^= 0x5A
    write(t, "damaged_scan.jpg", bytes(damaged))
    write(t, "declares_100000x100000.png", png_declaring(100000, 100000))
    write(t, "declares_2000x1.png", png_declaring(2000, 1))
    write(t, "not_an_image.bin", b"GIF89a\x01\x00\x01\x00")
    return pngs, jpgs


# --- npy -----------------------------------------------------------------------------------------
def npy_seeds():
    t = "npy"
    f32 = rng.standard_normal((3, 4, 4)).astype("<f4")
    write(t, "f4_chw.npy", npy_bytes(f32))
    write(t, "f8_bchw.npy", npy_bytes(rng.standard_normal((1, 1, 2, 2)).astype("<f8")))
    write(t, "f4_scalar.npy", npy_bytes(np.array(1.5, dtype="<f4")))
    write(t, "f4_empty.npy", npy_bytes(np.zeros((0, 3), dtype="<f4")))
    write(t, "f4_v2.npy", npy_bytes(f32[:1], version=(2, 0)))
    write(t, "f4_v3.npy", npy_bytes(f32[:1, :1], version=(3, 0)))
    write(t, "fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 3), dtype="<f4"))))
    write(t, "i4.npy", npy_bytes(np.arange(6, dtype="<i4").reshape(2, 3)))
    write(t, "f4_big_endian.npy", npy_bytes(np.ones((2, 2), dtype=">f4")))
    write(t, "f4_truncated.npy", npy_bytes(f32)[:-3])


# --- safetensors ---------------------------------------------------------------------------------
def safetensors_bytes(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    t = "safetensors"
    f32 = rng.standard_normal(6).astype("<f4").tobytes()
    write(t, "two_tensors.safetensors", safetensors_bytes(
        {"w": ("F32", [2, 3], f32), "step": ("I64", [2], struct.pack("<qq", 7, -1))},
        metadata={"format": "pt"}))
    write(t, "dtypes.safetensors", safetensors_bytes({
        "a": ("BF16", [2], b"\x80\x3f\x00\x40"), "b": ("F16", [1], b"\x00\x3c"),
        "c": ("BOOL", [3], b"\x01\x00\x01"), "d": ("U8", [2, 2], b"abcd"),
        "e": ("I8", [1], b"\xff"), "f": ("I16", [1], b"\x01\x02"), "g": ("I32", [1], b"\x01\x02\x03\x04"),
        "h": ("F64", [1], struct.pack("<d", 2.5))}))
    write(t, "empty_tensor.safetensors", safetensors_bytes({"z": ("F32", [0, 4], b""), "s": ("F32", [], f32[:4])}))
    write(t, "empty_header.safetensors", safetensors_bytes({}, pad=False))
    bad = safetensors_bytes({"w": ("F32", [2, 3], f32)})
    write(t, "truncated.safetensors", bad[:-5])
    write(t, "header_too_long.safetensors", struct.pack("<Q", 1 << 40) + bad[8:])
    text = b'{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}'
    write(t, "offsets_outside.safetensors", struct.pack("<Q", len(text)) + text + f32)
    # Tensors sharing bytes (refused), one inside another, and invalid UTF-8 in a tensor's name.
    text = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
    write(t, "overlapping.safetensors", struct.pack("<Q", len(text)) + text + f32[:12])
    text = (b'{"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},'
            b'"c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}')
    write(t, "nested_overlap.safetensors", struct.pack("<Q", len(text)) + text + f32)
    text = b'{"w\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"caf\xc3\xa9"}}'
    write(t, "invalid_utf8_name.safetensors", struct.pack("<Q", len(text)) + text + f32[:8])


# --- config.json ---------------------------------------------------------------------------------
def config_seeds():
    t = "config"
    for model in ("tost-austen", "tost-digits"):
        write(t, f"{model}.json", (ROOT / "models" / model / "config.json").read_bytes())
    vision = {"name": "v", "architecture": "tost_vision",
              "vision": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 2,
                         "num_classes": 2, "image_height": 5, "image_width": 7}}
    write(t, "vision_minimal.json", json.dumps(vision))
    vision_full = dict(vision, dtype="bfloat16", trained=True, version=3, labels=["cat", "dog"],
                       preprocess={"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]})
    write(t, "vision_full.json", json.dumps(vision_full))
    lm = {"name": "l", "architecture": "tost_lm", "dtype": "float16",
          "lm": {"n_layer": 2, "n_head": 2, "n_embd": 8, "context_length": 64, "vocab_size": 300,
                 "bias": True}}
    write(t, "lm_byte.json", json.dumps(lm))
    write(t, "lm_bpe.json", json.dumps(dict(lm, tokenizer={"type": "bpe", "file": "tok.json",
                                                          "eos_token_id": 299})))
    write(t, "lm_gpt2_ranks.json", json.dumps(dict(
        lm, lm=dict(lm["lm"], vocab_size=50304), tokenizer={"type": "gpt2", "ranks_file": "gpt2.tiktoken"})))
    write(t, "lm_gpt2_encoder.json", json.dumps(dict(
        lm, lm=dict(lm["lm"], vocab_size=50304),
        tokenizer={"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe"})))
    write(t, "lm_none.json", json.dumps(dict(lm, tokenizer={"type": "none", "eos_token_id": -1})))
    write(t, "bad_patch_size.json", json.dumps(dict(vision, vision=dict(vision["vision"], patch_size=3))))
    write(t, "bad_file_name.json", json.dumps(dict(lm, tokenizer={"type": "bpe", "file": "../x"})))
    write(t, "bad_type.json", '{"name": "x", "architecture": "tost_lm", "trained": "yes", "lm": {}}')
    # Strings reach ListModels, which needs UTF-8: invalid bytes in a value, a key and a label are
    # refused; valid multi-byte text (and an unknown key cut at 64 bytes inside a character) is not.
    write(t, "invalid_utf8_name.json", json.dumps(vision).encode().replace(b'"v"', b'"v\xff"', 1))
    write(t, "invalid_utf8_key.json", json.dumps(lm).encode().replace(b'"dtype"', b'"dt\xc3pe"', 1))
    write(t, "invalid_utf8_label.json",
          json.dumps(vision_full).encode().replace(b'"dog"', b'"d\xed\xa0\x80g"', 1))
    write(t, "utf8_strings.json", json.dumps(dict(
        vision_full, labels=["caf\u00e9", "\U0001F600"], provenance={"description": "na\u00efve"},
        serving={"\u00e9" * 40: "cpu"}), ensure_ascii=False))


# --- tokenizers ----------------------------------------------------------------------------------
TEXTS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that Netherfield Park "
    "is let at last?\"\n\nMr. Bennet replied that he had not.",
    "  leading spaces,\ttabs\r\nand   runs    of  spaces  ",
    "numbers 1813, 3.14159 and 1,000,000; code: x[i] += f(y) // 42",
    "Unicode: caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \u0645\u0631\u062d\u0628\u0627 "
    "\U0001F600\u200d\U0001F680",
    "<|endoftext|> inside text is text",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]


def bpe_seeds():
    t = "bpe_tokenizer"
    # Cut-down copies of tokenizer.json: the whole file (18 KB) would make every mutation slow; the
    # target parses it at start-up and encodes every text-only input with it.
    tok_text = (ROOT / "models" / "tost-austen" / "tokenizer.json").read_text()
    tok = json.loads(tok_text)
    for i, text in enumerate(TEXTS):
        write(t, f"text_{i}.txt", text)
    write(t, "text_invalid_utf8.txt", b"bytes \xff\xfe \xc3( \xe2\x82 end")
    for n in (0, 12, 40):
        small = dict(tok, merges=tok["merges"][:n], special_tokens={"<|endoftext|>": 256 + n})
        write(t, f"tokenizer_{n}_merges.bin", json.dumps(small).encode() + b"\0" + TEXTS[0].encode())
    small = dict(tok, merges=tok["merges"][:8], special_tokens={"<|endoftext|>": 264}, max_piece_bytes=3)
    write(t, "tokenizer_short_pieces.bin", json.dumps(small).encode() + b"\0" + TEXTS[3].encode())
    bad = dict(tok, merges=[[104, 101], [300, 32]], special_tokens={"<|endoftext|>": 258})
    write(t, "tokenizer_future_id.bin", json.dumps(bad).encode() + b"\0" + TEXTS[0].encode())


def gpt2_seeds():
    t = "gpt2_tokenizer"
    fixtures = ROOT / "tests" / "model" / "fixtures" / "gpt2"
    cases = json.loads((fixtures / "cases.json").read_text())["cases"]
    for case in cases:
        if 0 < len(case["text"].encode()) <= 2000:
            write(t, f"text_{case['name']}.txt", case["text"])
    write(t, "text_invalid_utf8.txt", b"bytes \xff\xfe \xc3( \xe2\x82 end \xf0\x9f")
    encoder_text = (fixtures / "encoder.json").read_text()
    merges_text = (fixtures / "vocab.bpe").read_text()
    ranks_text = (fixtures / "gpt2.tiktoken").read_text()
    sample = cases[0]["text"].encode()
    # Cut-down files (the 256 byte tokens, the first merges, end of text): the whole fixture files
    # (15 KB) would make every mutation slow; the target parses them at start-up and encodes every
    # text-only input with them.
    encoder = json.loads(encoder_text)
    merge_lines = merges_text.splitlines()
    kept_merges = merge_lines[1:13]
    by_id = sorted(encoder.items(), key=lambda kv: kv[1])
    small = {text: i for text, i in by_id[:256]}
    for line in kept_merges:
        left, right = line.split(" ")
        small.setdefault(left + right, len(small))
    small["<|endoftext|>"] = len(small)
    write(t, "small_encoder_and_merges.bin", json.dumps(small, ensure_ascii=False).encode() + b"\0" +
          "\n".join(["#version: 0.2"] + kept_merges).encode() + b"\0" + sample)
    rank_lines = ranks_text.splitlines()
    write(t, "small_ranks.bin", "\n".join(rank_lines[:270]).encode() + b"\0" + sample)
    renumbered = [f"{line.split(' ')[0]} {i}" for i, line in enumerate(rank_lines[1:270])]
    write(t, "ranks_missing_byte.bin", "\n".join(renumbered).encode() + b"\0" + sample)


# --- protobuf messages ---------------------------------------------------------------------------
def generated_protos():
    """tost.v1, its session state and KServe v2 messages (tools/pylib/tost_protos.py)."""
    sys.path.insert(0, str(ROOT / "tools" / "pylib"))
    import tost_protos

    return tost_protos.tost()[0], tost_protos.session_state(), tost_protos.kserve()[0]


# Blob layout (service/engine/session_codec.h): "TOSTSESS" | u32 version | u32 payload length |
# payload (tost.v1.internal.SessionState) | HMAC-SHA256(key, all before); little-endian.
def session_blob(payload, version=2, key=SESSION_KEY):
    body = b"TOSTSESS" + struct.pack("<II", version, len(payload)) + payload
    return body + hmac.new(key, body, hashlib.sha256).digest()


def session_seeds(pb):
    t = "session_codec"
    # The model and the fake clock of tests/fuzz/session_codec_fuzz.cc: 2 layers, n_embd 4,
    # n_head 2, vocab 300, context 64; now = 1763000000 s. The blobs were exported a minute ago.
    now_ms = 1_763_000_000_000
    exported_ms = now_ms - 60_000

    def state(**changes):
        s = pb.SessionState(model="fuzz-lm", weights_sha256=b"\xab" * 32, n_layer=2, n_embd=4,
                            n_head=2, vocab_size=300, context_length=64, position=5,
                            stats=np.linspace(-1, 1, 20, dtype="<f4").tobytes(), pending_token=17,
                            exported_unix_ms=exported_ms)
        s.sampling.temperature = 0.8
        s.sampling.top_k = 40
        s.sampling.top_p = 0.95
        s.sampling.min_p = 0.05
        s.sampling.repetition_penalty = 1.1
        s.sampling.repetition_window = 8
        s.sampling.seed = 12345
        s.stop_strings.extend(["\n\n", "THE END"])
        s.stop_token_ids.extend([256, 13])
        s.recent_tokens.extend([1, 2, 3, 17])
        s.utf8_pending = b"\xe2\x82"
        s.held_text = b"THE"
        s.generated_tokens = 4
        for k, v in changes.items():
            setattr(s, k, v)
        return s.SerializeToString()

    write(t, "unbound.blob", session_blob(state()))
    write(t, "owned_expiring.blob", session_blob(state(owner="alice", expires_unix_ms=now_ms + 3_600_000)))
    write(t, "owned_by_other.blob", session_blob(state(owner="bob")))
    write(t, "expired.blob", session_blob(state(expires_unix_ms=now_ms - 1)))
    write(t, "far_times.blob", session_blob(state(exported_unix_ms=-(2**63), expires_unix_ms=2**63 - 1)))
    write(t, "version1.blob", session_blob(state(), version=1))
    fresh = pb.SessionState(model="fuzz-lm", weights_sha256=b"\xab" * 32, n_layer=2, n_embd=4,
                            n_head=2, vocab_size=300, context_length=64,
                            stats=bytes(80), pending_token=-1, exported_unix_ms=exported_ms)
    fresh.sampling.temperature = 1.0
    fresh.sampling.top_p = 1.0
    fresh.sampling.repetition_penalty = 1.0
    write(t, "fresh_session.blob", session_blob(fresh.SerializeToString()))
    write(t, "version3.blob", session_blob(state(), version=3))
    write(t, "other_model.blob", session_blob(state(model="tost-austen")))
    write(t, "other_dimensions.blob", session_blob(state(n_embd=8)))
    write(t, "short_stats.blob", session_blob(state(stats=b"\0" * 12)))
    write(t, "position_past_context.blob", session_blob(state(position=65)))
    write(t, "retired_key.blob", session_blob(state(), key=b"tost-fuzz-retired-key-0123456789"))
    write(t, "other_key.blob", session_blob(state(), key=b"another-key-of-32-bytes-........"))
    write(t, "truncated.blob", session_blob(state())[:-7])
    write(t, "not_a_blob.bin", b"TOSTSES")
    # Session key files (ParseSessionKeys): a key list and a single key; the target reads every
    # input as a blob and as a key file.
    write(t, "keys_list.txt", "tost-session-keys\n# new key, signs\n"
          "base64:q83vASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4k=\n\n"
          "  an-older-secret-of-at-least-16-bytes  \n")
    write(t, "keys_single.bin", bytes(range(7, 39)))
    write(t, "keys_bad.txt", "tost-session-keys\nbase64:not*base64\nshort\n")


def request_seeds(tost_pb2, kserve_pb2, pngs, jpgs):
    t = "request_input"
    rgb = (3, 4, 4)
    gray = (1, 3, 5)

    def tensor(shape, raw=False):
        n = int(np.prod(shape))
        values = rng.uniform(-2, 2, n).astype("<f4")
        ft = tost_pb2.FloatTensor(shape=list(shape))
        if raw:
            ft.raw = values.tobytes()
        else:
            ft.data.extend(values.tolist())
        return ft

    def tost(selector, name, request):
        write(t, name, bytes([selector]) + request.SerializeToString())

    def kserve(selector, name, request):
        write(t, name, bytes([selector | 1]) + request.SerializeToString())

    tost(0, "tost_rgb_data.bin", tost_pb2.ClassifyRequest(model="m", tensor=tensor((1,) + rgb), top_k=3))
    tost(0, "tost_rgb_raw_batch2.bin", tost_pb2.ClassifyRequest(model="m", tensor=tensor((2,) + rgb, raw=True)))
    tost(0, "tost_rgb_unbatched.bin", tost_pb2.ClassifyRequest(model="m", tensor=tensor(rgb)))
    tost(2, "tost_gray_data.bin", tost_pb2.ClassifyRequest(model="m", tensor=tensor((1,) + gray)))
    tost(2, "tost_gray_wrong_shape.bin", tost_pb2.ClassifyRequest(model="m", tensor=tensor((1,) + rgb)))
    nan = tensor((1,) + rgb)
    nan.data[5] = float("nan")
    tost(0, "tost_rgb_nan.bin", tost_pb2.ClassifyRequest(model="m", tensor=nan))
    tost(0, "tost_images.bin", tost_pb2.ClassifyRequest(
        model="m", images=[pngs["rgb_8x8.png"], jpgs["gray_7x5.jpg"]], top_k=2))
    tost(2, "tost_gray_images.bin", tost_pb2.ClassifyRequest(
        model="m", images=[pngs["gray_5x3.png"], pngs["rgba_4x4.png"], jpgs["rgb_8x8.jpg"]]))

    def infer(name, datatype, shape, **fields):
        req = kserve_pb2.ModelInferRequest(model_name="m", id="fuzz")
        tensor_in = req.inputs.add(name=name, datatype=datatype, shape=list(shape))
        for k, v in fields.items():
            if k == "raw":
                req.raw_input_contents.extend(v)
            else:
                getattr(tensor_in.contents, k).extend(v)
        out = req.outputs.add(name="probabilities")
        out.parameters["classification"].int64_param = 2
        return req

    values = rng.uniform(-2, 2, 2 * 48).astype("<f4")
    kserve(0, "kserve_rgb_fp32.bin", infer("image", "FP32", (1,) + rgb, fp32_contents=values[:48].tolist()))
    kserve(0, "kserve_rgb_raw.bin", infer("image", "FP32", (2,) + rgb, raw=[values.tobytes()]))
    kserve(2, "kserve_gray_fp32.bin", infer("image", "FP32", (1,) + gray, fp32_contents=values[:15].tolist()))
    kserve(0, "kserve_bytes.bin", infer("image_bytes", "BYTES", (2,),
                                        bytes_contents=[pngs["rgb_13x9.png"], jpgs["rgb_8x8.jpg"]]))
    split = b"".join(struct.pack("<I", len(x)) + x for x in (pngs["gray_1x1.png"], jpgs["gray_1x1.jpg"]))
    kserve(2, "kserve_bytes_raw.bin", infer("image_bytes", "BYTES", (2, 1), raw=[split]))
    kserve(0, "kserve_wrong_datatype.bin", infer("image", "FP16", (1,) + rgb, raw=[values[:48].tobytes()]))


def inflate_seeds():
    """Compressed messages as the inflate target reads them: a byte picking the format (bit 0:
    gzip) and the output limit, a byte picking how the rest is cut, then the compressed bytes."""
    t = "inflate"
    text = b"It was a bright cold day in April, and the clocks were striking thirteen. " * 8
    gz, zl = gzip.compress(text, mtime=0), zlib.compress(text)
    limit_64k = 4 << 1  # kLimits[4]
    write(t, "gzip_whole.bin", bytes([1 | limit_64k, 0]) + gz)
    write(t, "deflate_cut_in_3.bin", bytes([0 | limit_64k, 2]) + zl)
    write(t, "gzip_past_limit_64.bin", bytes([1 | (2 << 1), 1]) + gz)
    write(t, "gzip_bomb.bin", bytes([1 | (3 << 1), 3]) + gzip.compress(bytes(1 << 20), mtime=0))
    write(t, "gzip_truncated.bin", bytes([1 | limit_64k, 1]) + gz[:-9])
    write(t, "deflate_trailing_bytes.bin", bytes([limit_64k, 0]) + zl + b"tail")
    write(t, "gzip_empty.bin", bytes([1 | limit_64k, 0]) + gzip.compress(b"", mtime=0))
    write(t, "not_compressed.bin", bytes([1 | limit_64k, 5]) + text[:40])


# --- OpenAI-compatible request bodies -------------------------------------------------------------
def openai_request_seeds():
    # First byte: the endpoint (even: /v1/completions, odd: /v1/chat/completions).
    def seed(name, endpoint, body):
        if not isinstance(body, bytes):
            body = json.dumps(body).encode("utf-8")
        write("openai_request", name, bytes([endpoint]) + body)

    completion = {"model": "tost-austen", "prompt": "It is a truth", "max_tokens": 16}
    seed("completion_minimal", 0, completion)
    seed("completion_full", 0, {
        **completion, "temperature": 0.7, "top_p": 0.9, "seed": -3, "stop": ["\n", "."],
        "logprobs": 2, "n": 2, "stream": True, "stream_options": {"include_usage": True},
        "echo": False, "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {},
        "user": "u", "best_of": 2, "suffix": "", "return_state": True, "unknown": [1, {"a": 2}]})
    seed("completion_tokens", 0, {"model": "m", "prompt": [73, 116, 32, 2047], "stop": "x"})
    seed("completion_token_batch", 0, {"model": "m", "prompt": [[1, 2], [3]]})
    seed("completion_string_batch", 0, {"model": "m", "prompt": ["a", "b"]})
    seed("completion_session", 0, {"model": "m", "prompt": " more", "session_id": "s-1"})
    seed("completion_state", 0, {"model": "m", "prompt": "", "state": "AAECAwQ=", "return_state": True})
    seed("completion_refused", 0, {"model": "m", "prompt": "x", "echo": True, "logprobs": 21})
    seed("completion_utf8", 0, {"model": "m", "prompt": "h\u00e9\u20ac\U0001f600", "stop": "\u20ac"})
    seed("completion_bad_utf8", 0, b'{"model": "m", "prompt": "\xc3("}')
    chat = {"model": "tost-austen", "messages": [
        {"role": "system", "content": "A drawing room."},
        {"role": "user", "content": "Is he not handsome?"},
        {"role": "assistant", "content": [{"type": "text", "text": "He is."}]},
        {"role": "user", "content": "And his friend?"}]}
    seed("chat_minimal", 1, {"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    seed("chat_full", 1, {
        **chat, "max_completion_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3,
        "stream": True, "stream_options": {"include_usage": True}, "stop": ["!"], "n": 3,
        "tools": [], "tool_choice": "none", "response_format": {"type": "text"}})
    seed("chat_refused_role", 1, {"model": "m", "messages": [{"role": "robot", "content": "x"}]})
    seed("chat_refused_part", 1, {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    seed("chat_refused_tools", 1, {**chat, "tools": [{"type": "function"}],
                                   "response_format": {"type": "json_object"}})
    seed("chat_session", 1, {**chat, "session_id": "s", "n": 2})
    # Structured output: response_format's shapes and vLLM's guided_* fields.
    seed("chat_json_schema", 1, {**chat, "response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "strict": True, "description": "d",
        "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                   "required": ["b", "a"]}}}})
    seed("chat_json_object", 1, {**chat, "response_format": {"type": "json_object"}})
    seed("completion_guided_json_text", 0, {**completion, "guided_json": '{"type": "boolean"}'})
    seed("completion_guided_regex", 0, {**completion, "guided_regex": "[a-z]+@[a-z]+\\.org"})
    seed("completion_guided_grammar", 0, {**completion, "guided_grammar": 'root ::= "yes" | "no"'})
    seed("completion_guided_choice", 0, {**completion, "guided_choice": ["yes", "no", "caf\u00e9"]})
    seed("completion_two_constraints", 0, {**completion, "guided_choice": ["a"], "guided_regex": "a",
                                           "response_format": {"type": "json_object"}})
    # vLLM's sampling fields, stop ids and OpenAI's logit_bias; names; OpenAI's service-only fields.
    seed("completion_vllm_sampling", 0, {
        **completion, "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.3,
        "stop_token_ids": [2047, 7], "logit_bias": {"7": -100, "300": 2.5, "07": 1},
        "max_completion_tokens": 16})
    seed("completion_logit_bias_bad", 0, {**completion, "logit_bias": {"-1": 1, "x": 101}})
    tool = {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {
        "type": "object", "properties": {"town": {"type": "string"}, "next": {"$ref": "#"}},
        "required": ["town"]}}}
    seed("chat_tools_required", 1, {**chat, "tools": [tool, {"type": "function", "function": {"name": "f"}}],
                                    "tool_choice": "required", "parallel_tool_calls": False})
    seed("chat_tools_round_trip", 1, {"model": "m", "tools": [tool], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}, "messages": [
        {"role": "user", "content": "Rain?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "wet"},
        {"role": "tool", "tool_call_id": "c2", "content": "unknown call"}]})
    seed("chat_tools_unending", 1, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                    "tools": [{"type": "function", "function": {
                                        "name": "f", "parameters": {"$ref": "#/$defs/a", "$defs": {
                                            "a": {"allOf": [{"$ref": "#/$defs/a"}]}}}}}]})
    seed("completion_echo_scoring", 0, {"model": "m", "prompt": [[73, 116, 32]], "echo": True,
                                        "logprobs": 1, "max_tokens": 0, "temperature": 0})
    seed("completion_structured_outputs", 0, {**completion, "structured_outputs": {
        "json": {"type": "object", "properties": {"a": {"type": "integer"}}}, "regex": None}})
    seed("completion_structured_outputs_two", 0, {**completion, "structured_outputs": {
        "choice": ["a"], "grammar": "root ::= \"a\"", "whitespace_pattern": " "}})
    seed("chat_names_and_service_fields", 1, {
        "model": "m", "messages": [{"role": "user", "content": "Hi", "name": "Emma"},
                                   {"role": "assistant", "content": "", "refusal": "no"}],
        "store": False, "metadata": {}, "modalities": ["text"], "service_tier": "flex",
        "reasoning_effort": "none", "parallel_tool_calls": True, "prompt_cache_key": "k",
        "stream": True, "stream_options": {"include_obfuscation": True}})


# --- Responses and Conversations API request bodies ----------------------------------------------
def responses_request_seeds():
    # First byte, mod 4: POST /v1/responses, then the conversation bodies create, update and
    # add-items (tests/fuzz/responses_request_fuzz.cc).
    def seed(name, parser, body):
        if not isinstance(body, bytes):
            body = json.dumps(body, ensure_ascii=False).encode("utf-8")
        write("responses_request", name, bytes([parser]) + body)

    items = [
        {"role": "developer", "content": "Answer in one line."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Is he not handsome?"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "He is.", "annotations": []}]},
        {"role": "user", "content": "And caf\u00e9 \U0001f600?"}]
    seed("response_minimal", 0, {"model": "m", "input": "Hi"})
    seed("response_items", 0, {
        "model": "tost-austen", "input": items, "instructions": "Be brief.", "store": False,
        "max_output_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": -3, "stream": True,
        "metadata": {"topic": "novels", "\u00e9" * 64: "v" * 512}, "user": "u",
        "safety_identifier": "s", "prompt_cache_key": "k", "return_state": True,
        "tools": [], "tool_choice": "auto", "parallel_tool_calls": False, "background": False,
        "include": [], "truncation": "disabled", "service_tier": "default",
        "text": {"format": {"type": "text"}, "verbosity": "medium"}})
    seed("response_previous", 0, {"model": "m", "input": "More.",
                                  "previous_response_id": "resp_" + "0" * 32})
    seed("response_conversation", 0, {"model": "m", "input": [{"role": "user", "content": "x"}],
                                      "conversation": {"id": "conv_" + "a" * 32}})
    seed("response_state", 0, {"model": "m", "input": "", "state": "AAEC/w=="})
    seed("response_json_schema", 0, {"model": "m", "input": "Who?", "text": {"format": {
        "type": "json_schema", "name": "person", "strict": False, "description": "d",
        "schema": {"type": "object",
                   "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                   "required": ["b", "a"]}}}})
    seed("response_json_object", 0, {"model": "m", "input": "JSON",
                                     "text": {"format": {"type": "json_object"}}})
    seed("response_refused_part", 0, {"model": "m", "input": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})
    seed("response_refused_fields", 0, {"model": "m", "input": "x", "reasoning": {"effort": "low"},
                                        "previous_response_id": "resp_1", "conversation": "conv_1"})
    seed("response_bad_utf8", 0, b'{"model": "m", "input": "\xc3("}')
    seed("conversation_create", 1, {"items": items, "metadata": {"k": "v"}})
    seed("conversation_create_empty", 1, {"items": []})
    seed("conversation_update", 2, {"metadata": {"a": "1", "b": ""}})
    seed("conversation_update_refused", 2, {"metadata": {"k": 1}, "items": []})
    seed("conversation_add_items", 3, {"items": items[1:]})
    seed("conversation_add_items_refused", 3, {"items": [{"type": "function_call_output"}]})
    # An unknown key that is empty: its refusal once came without a param.
    seed("conversation_update_empty_key", 2, {"": {"a": "1", "b": ""}})
    seed("response_long_unknown_key", 0, {"model": "m", "input": "x", "k" * 200: 1})


# --- constraints of structured output ---------------------------------------------------------------
def constraint_compile_seeds():
    """Constraints as the constraint_compile target reads them: a byte picking the kind (0 JSON
    schema, 1 regex, 2 EBNF grammar, 3 choices), then the text; for choices the text's first byte
    is the separator the rest is split at."""
    def seed(name, kind, text):
        if not isinstance(text, bytes):
            text = text.encode("utf-8")
        write("constraint_compile", name, bytes([kind]) + text)

    def schema(name, value):
        seed(name, 0, json.dumps(value, separators=(",", ":")))

    schema("schema_nested", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                     "minItems": 1, "maxItems": 3},
            "address": {"type": "object",
                        "properties": {"city": {"type": "string"},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city"]}},
        "required": ["name", "age"]})
    schema("schema_formats", {
        "type": "object",
        "properties": {"email": {"type": "string", "format": "email"},
                       "when": {"type": "string", "format": "date-time"},
                       "id": {"type": "string", "format": "uuid"},
                       "ip": {"type": "string", "format": "ipv4"}},
        "additionalProperties": False})
    schema("schema_recursive_ref", {
        "$defs": {"node": {"type": "object",
                           "properties": {"value": {"type": "number"},
                                          "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                             {"type": "null"}]}},
                           "required": ["value"]}},
        "$ref": "#/$defs/node"})
    schema("schema_enum_const", {"oneOf": [{"enum": ["red", "green", 1, None, True]},
                                           {"const": {"k": [1, 2.5, "\u00e9"]}}]})
    schema("schema_tuple", {"type": "array",
                            "prefixItems": [{"type": "boolean"},
                                            {"type": "number", "exclusiveMinimum": 0}],
                            "items": False})
    schema("schema_bad_ref", {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    seed("schema_not_json", 0, '{"type": "object", "properties": {')
    seed("schema_empty", 0, "")
    seed("regex_email", 1, r"[a-z]+@[a-z]+\.(com|org)")
    seed("regex_phone", 1, r"(\d{3}-){2}\d{4}|\(\w+\)\s*[^\n]{0,8}")
    seed("regex_utf8", 1, "caf[e\u00e9]\u00e9?x{2,5}(?:ab)*")
    seed("regex_unclosed", 1, "(unclosed[a-")
    # Escapes past U+10FFFF overflowed XGrammar's int before patch 0004 (third_party/xgrammar).
    seed("regex_escape_past_u10ffff", 1, r"a\x80000000b")
    seed("grammar_escape_past_u10ffff", 2, 'root ::= "\\U7fffffffx" [\\x110000]\n')
    seed("grammar_arithmetic", 2, 'root ::= expr\nexpr ::= term ("+" term)*\n'
                                  'term ::= [0-9]+ | "(" expr ")"\n')
    seed("grammar_classes", 2, 'root ::= "\\"" [^"\\\\]* "\\"" | [a-zA-Z_] [a-zA-Z0-9_]{0,7}'
                               ' | "\\u00e9"+ | "\\x41"?\n')
    seed("grammar_undefined_rule", 2, "root ::= missing\n")
    seed("choice_words", 3, "|yes|no|maybe")
    seed("choice_escapes", 3, '\nsay "hi"\nback\\slash\ntab\there\ncaf\u00e9\n\x01ctl')
    seed("choice_empty_one", 3, ",a,,b")
    seed("choice_bad_utf8", 3, b"|ok|\xc3(")


def main():
    # Inputs that once crashed a parser (regression-*, added by hand after the fix) are kept.
    if CORPUS.exists():
        for path in CORPUS.glob("*/*"):
            if not path.name.startswith("regression-"):
                path.unlink()
    pngs, jpgs = image_seeds()
    npy_seeds()
    safetensors_seeds()
    config_seeds()
    bpe_seeds()
    inflate_seeds()
    openai_request_seeds()
    responses_request_seeds()
    constraint_compile_seeds()
    gpt2_seeds()
    tost_pb2, session_pb2, kserve_pb2 = generated_protos()
    session_seeds(session_pb2)
    request_seeds(tost_pb2, kserve_pb2, pngs, jpgs)
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    count = sum(1 for p in CORPUS.rglob("*") if p.is_file())
    print(f"make_seeds: {count} seeds, {total} bytes in {CORPUS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
