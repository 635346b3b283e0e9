#!/usr/bin/env python3
"""Byte-level BPE tokenizer "tost-bpe-v1": trainer, encoder and file format.

The server's C++ tokenizer (model/text/bpe_tokenizer.cc) implements the same encoding; the two are held
equal by the fixtures tools/make_parity_fixtures.py writes and tests/model/text_test.cc checks.

Why BPE for a "byte-level" LM: causal TSSA mixes tokens only through running second moments over
the whole prefix, so a model whose tokens are single bytes cannot single out the previous byte and
stays at a byte-bigram level (tools/train_lm.py --probe measures it). Byte-level BPE, the scheme
GPT-2 and the official ToST LM use, keeps every byte sequence encodable (ids 0-255 are the bytes
themselves, so there is no unknown token) while a token is most of a word.

Encoding, exactly:
1. Pre-tokenisation splits the bytes into pieces; no merge crosses a piece boundary. Byte classes:
   letter = A-Z, a-z and every byte >= 0x80 (UTF-8 sequences stay inside words), digit = 0-9,
   space = the six ASCII whitespace bytes (\\t \\n \\v \\f \\r and ' '), other = the rest.
   Scanning from the start:
   - a run of space bytes that is followed by a non-space byte and ends in ' ' gives its last ' '
     to the next piece (" word"); the rest of the run (if any) is a piece of its own;
   - any other run of space bytes is one piece;
   - otherwise a piece is an optional leading ' ' and then a maximal run of one class
     (letter, digit or other).
   A piece never exceeds MAX_PIECE_BYTES bytes: a longer run is cut into pieces of that length
   (the leading space counts), which bounds the cost of encoding hostile input.
2. Each piece starts as its bytes (ids 0-255). Repeatedly: among adjacent pairs, take the pair
   with the lowest merge rank; replace every occurrence of it, left to right without overlaps, by
   the merged id 256 + rank; stop when no adjacent pair has a rank.
3. Special ids follow the merges; the end-of-text id is the last id of the vocabulary.

Training: merges are learned on piece frequencies of the training text only; each round merges
the most frequent adjacent pair (ties: the smallest (left id, right id)).

File (tokenizer.json next to config.json):
  {"format": "tost-bpe-v1", "max_piece_bytes": 32, "merges": [[left, right], ...],
   "special_tokens": {"<|endoftext|>": id}}
"""

from __future__ import annotations

import collections
import json
from typing import Dict, Iterable, List, Sequence, Tuple

FORMAT = "tost-bpe-v1"
MAX_PIECE_BYTES = 32
EOT = "<|endoftext|>"

_SPACE = frozenset(b"\t\n\v\f\r ")
_LETTER, _DIGIT, _SPACE_CLASS, _OTHER = 0, 1, 2, 3


def _byte_class(b: int) -> int:
    if b in _SPACE:
        return _SPACE_CLASS
    if 48 <= b <= 57:
        return _DIGIT
    if 65 <= b <= 90 or 97 <= b <= 122 or b >= 0x80:
        return _LETTER
    return _OTHER


_CLASS = bytes(_byte_class(b) for b in range(256))


def pre_tokenize(data: bytes, max_piece_bytes: int = MAX_PIECE_BYTES) -> List[bytes]:
    """The pieces of ``data`` (their concatenation is ``data``)."""
    pieces: List[bytes] = []
    n, i = len(data), 0

    def emit(start: int, end: int) -> None:
        for s in range(start, end, max_piece_bytes):
            pieces.append(data[s:min(end, s + max_piece_bytes)])

    while i < n:
        cls = _CLASS[data[i]]
        if cls == _SPACE_CLASS:
            j = i
            while j < n and _CLASS[data[j]] == _SPACE_CLASS:
                j += 1
            if j < n and data[j - 1] == 0x20:
                if j - 1 > i:
                    emit(i, j - 1)
                start, i = j - 1, j  # the ' ' leads the next piece
            else:
                emit(i, j)
                i = j
                continue
        else:
            start = i
        cls = _CLASS[data[i]]
        j = i
        while j < n and _CLASS[data[j]] == cls:
            j += 1
        emit(start, j)
        i = j
    return pieces


def _merge_pair(ids: Sequence[int], pair: Tuple[int, int], new_id: int) -> List[int]:
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class Tokenizer:
    def __init__(self, merges: Sequence[Tuple[int, int]], max_piece_bytes: int = MAX_PIECE_BYTES):
        self.merges = [tuple(m) for m in merges]
        self.max_piece_bytes = max_piece_bytes
        self.ranks = {pair: r for r, pair in enumerate(self.merges)}
        self.vocab: List[bytes] = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            if not (0 <= a < len(self.vocab) and 0 <= b < len(self.vocab)):
                raise ValueError(f"merge {len(self.vocab) - 256} ({a}, {b}) refers to an id not yet defined")
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.eot_id = len(self.vocab)
        self.vocab_size = self.eot_id + 1
        self._cache: Dict[bytes, List[int]] = {}

    def encode_piece(self, piece: bytes) -> List[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        ids = list(piece)
        while len(ids) > 1:
            best = min(((self.ranks.get(p), p) for p in zip(ids, ids[1:]) if p in self.ranks), default=None)
            if best is None:
                break
            ids = _merge_pair(ids, best[1], 256 + best[0])
        if len(self._cache) < 1 << 20:
            self._cache[piece] = ids
        return ids

    def encode(self, data: bytes) -> List[int]:
        out: List[int] = []
        for piece in pre_tokenize(data, self.max_piece_bytes):
            out.extend(self.encode_piece(piece))
        return out

    def token_bytes(self, token: int) -> bytes:
        return self.vocab[token] if token < len(self.vocab) else b""

    def decode(self, ids: Iterable[int]) -> bytes:
        return b"".join(self.token_bytes(t) for t in ids)

    def to_json(self) -> Dict:
        return {"format": FORMAT, "max_piece_bytes": self.max_piece_bytes,
                "merges": [list(m) for m in self.merges], "special_tokens": {EOT: self.eot_id}}

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path}: format must be {FORMAT!r}, got {doc.get('format')!r}")
        tok = cls([tuple(m) for m in doc["merges"]], int(doc["max_piece_bytes"]))
        if doc.get("special_tokens", {}).get(EOT) != tok.eot_id:
            raise ValueError(f"{path}: {EOT} must be id {tok.eot_id}")
        return tok


def train(texts: Iterable[bytes], vocab_size: int, max_piece_bytes: int = MAX_PIECE_BYTES,
          progress=None) -> Tokenizer:
    """Learns vocab_size - 257 merges (256 bytes + merges + end-of-text = vocab_size)."""
    n_merges = vocab_size - 257
    if n_merges < 0:
        raise ValueError(f"vocab_size must be >= 257, got {vocab_size}")
    freq: collections.Counter = collections.Counter()
    for text in texts:
        freq.update(pre_tokenize(text, max_piece_bytes))
    words = [list(p) for p in freq]
    counts = list(freq.values())
    pair_count: collections.Counter = collections.Counter()
    where: Dict[Tuple[int, int], set] = collections.defaultdict(set)
    for wi, ids in enumerate(words):
        for p in zip(ids, ids[1:]):
            pair_count[p] += counts[wi]
            where[p].add(wi)
    merges: List[Tuple[int, int]] = []
    for r in range(n_merges):
        if not pair_count:
            break
        # Most frequent; ties by the smallest pair.
        pair = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pair_count[pair] <= 0:
            break
        new_id = 256 + r
        merges.append(pair)
        for wi in list(where.pop(pair, ())):
            old = words[wi]
            c = counts[wi]
            for p in zip(old, old[1:]):
                pair_count[p] -= c
                if pair_count[p] == 0:
                    del pair_count[p]
            new = _merge_pair(old, pair, new_id)
            words[wi] = new
            for p in zip(new, new[1:]):
                pair_count[p] += c
                where[p].add(wi)
        if progress is not None:
            progress(r + 1, n_merges)
    return Tokenizer(merges, max_piece_bytes)
