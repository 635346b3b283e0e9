#!/usr/bin/env python3
"""Write GPT-2 tokenizer fixtures: a small byte-level BPE in GPT-2's exact file formats, plus the
encodings the two reference implementations (tiktoken and Hugging Face `tokenizers`) give it.

Why: the server's `gpt2` tokenizer must encode exactly as GPT-2 does (the pre-tokenisation regex
below, the bytes_to_unicode mapping, merges applied by rank). The real GPT-2 files cannot be
downloaded here, so the merge table is learned from a small inline corpus; everything else - the
pre-tokenisation, the byte order of the 256 single-byte ids, the file formats - is GPT-2's. The
expected ids come from tiktoken, and the script refuses to write anything unless Hugging Face
`tokenizers`, built from the same vocabulary and merges, gives the same ids and both decode back
to the text. The output is deterministic, so tests/python/test_gpt2_fixtures.py can regenerate it
and compare it byte for byte with the committed copy.

Files written to --out:
  encoder.json   token (in bytes_to_unicode space) -> id: the 256 single bytes in GPT-2's order,
                 then one id per merge in merge order, then <|endoftext|> as the last id
  vocab.bpe      "#version: 0.2", then one merge per line ("left right", bytes_to_unicode space)
  gpt2.tiktoken  tiktoken's rank file: "base64(token bytes) rank" per mergeable token
  cases.json     {"meta": {...}, "cases": [{"name", "text", "pieces", "ids"}, ...]}; "pieces" are
                 the pre-tokenised pieces (substrings of text), "ids" tiktoken's encode_ordinary
                 (so "<|endoftext|>" inside a text is literal text, never the special id)
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
from typing import Dict, List, Sequence, Tuple

import regex
import tiktoken
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

# GPT-2's pre-tokenisation regex as the original encoder.py spells it (tiktoken's gpt2 spells the
# contractions '(?:[sdmt]|ll|ve|re), which matches the same strings). Case-sensitive: "'S" is not
# a contraction.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
NUM_MERGES = 480
ENCODING_NAME = "tost-gpt2-fixture"


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character map; its key order is the id order of the
    256 single-byte tokens in GPT-2's encoder.json (and tiktoken's gpt2 ranks)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENCODER = bytes_to_unicode()


def to_unicode(token: bytes) -> str:
    return "".join(BYTE_ENCODER[b] for b in token)


# ---------------------------------------------------------------------------------------------
# Corpus: written for these fixtures (no outside text, so regeneration needs nothing installed but
# the pinned packages). English prose gives word-sized merges; the non-ASCII lines give merges
# inside multi-byte UTF-8 sequences, which the encoder must handle the same way.

CORPUS = """\
The lighthouse stood at the end of the long stone pier, and the keeper had lived in it for \
thirty-one years. Every evening he climbed the one hundred and twelve steps, trimmed the wick, \
wound the clockwork that turned the lens, and wrote the weather in the log: the wind, the sea, \
the ships that passed, and anything else that seemed worth writing down.

He was not a talkative man, but he was not an unfriendly one either. When the children from the \
village came out along the pier on a summer afternoon, he would show them the great lens, and \
tell them how the light could be seen from twenty miles away on a clear night. They asked him \
whether he was ever lonely. He said that he had the gulls, the seals, the tide and the stars, \
and that a man who had those things and still felt lonely had not been paying attention.

In the winter the storms came in from the west. The waves broke over the end of the pier and \
the spray reached the windows of the lamp room, one hundred feet above the water. On those \
nights he did not sleep at all. He sat by the lamp with a pot of tea and watched the dark, and \
every hour he went down to check the doors and the stores, and then climbed back up again.

"It's the waiting that's hard," he told the new assistant, a young woman who had come from the \
city to learn the work. "You'll think nothing is happening, and most of the time you'd be right. \
But the one night you stop watching is the night they'll need you." She wrote that down in the \
back of the log, and he pretended not to notice.

She learned quickly. Within a month she could take the lens apart, clean every prism, and put \
it back together without a scratch. Within a season she knew the names of the fishing boats and \
the sound of each engine. She kept a second notebook of her own, in which she wrote the things \
the keeper said when he thought no one was listening: that the sea is never the same colour two \
days running, that a fog has a smell before it has a shape, that the best time to mend a thing \
is before it breaks.

The village had changed over the years. There had been a school, then there had not; there had \
been three shops, then two, then one that was also the post office. The harbour, which had once \
held forty boats, now held eleven. But the light still turned, and the ships still passed, and \
on the first of every month the supply boat still came out with oil, flour, coffee, letters and \
news.

In the spring of the year the keeper turned sixty-five, a letter came that said the light would \
be made automatic. A machine would turn the lens and switch the lamp, and a man from the city \
would visit twice a year to see that everything was working. The keeper read the letter twice, \
folded it, and put it in the drawer with the others. Then he went up the steps, as he did every \
evening, and lit the lamp.

The assistant asked him what he would do. He said he had thought about it for a long time, and \
that he would like to live in the village, in the small white house by the harbour wall, where \
he could still see the light from his kitchen window. "I won't be keeping it," he said, "but I \
can still keep an eye on it. That's not nothing."

On his last night in the lighthouse the weather was calm and the sky was full of stars. He wrote \
the wind, the sea and the ships in the log, as he always had, and at the bottom of the page he \
added one more line: all well, light burning, nothing to report. Then he gave the key to the \
assistant, who would stay on until the machine was installed, and walked back along the pier.

Years later, when people asked her about the lighthouse, she would tell them about the keeper, \
about the steps and the lens and the storms, and about the line at the bottom of the last page. \
She said it was the best thing anyone had ever written in that log, because it was true.

The keeper's house by the harbour wall had two rooms downstairs and two upstairs, a garden the \
size of a tablecloth, and a kitchen window that looked straight out to sea. He planted \
potatoes, beans and a row of sweet peas, and in the evenings he walked along the harbour to \
talk with the fishermen about the weather, the prices at the market, and the boats that were \
for sale.

Some of the fishermen had known him since they were boys. They remembered the winter when the \
supply boat could not come for six weeks, and he had shared his last tins of soup with the crew \
of a trawler that had sheltered in the lee of the pier. They remembered the summer when he had \
rowed out in the middle of the night to bring in a dinghy that had lost its oars. He did not \
talk about those things himself, but other people did, and he let them.

On Sundays he wrote letters: to his sister, who lived in the north; to an old friend from the \
navy; and, once a month, to the assistant, who had moved on to a larger light on the other side \
of the country. She wrote back with news of her work, of the storms she had kept watch through, \
of the things she had learned and the things she was still learning. He kept her letters in the \
drawer with the others, and read them again when the nights were long.

When he was seventy he bought a small telescope, and on clear nights he set it up in the garden \
and looked at the moon, the planets and the stars he had watched for so many years from the \
lamp room. He said that he had spent half his life looking out to sea, and that it was about \
time he looked up for a change. The children from the village came to look through it too, and \
he told them the names of the stars, and how sailors had used them to find their way home.

Le gardien du phare écrivait chaque soir : le vent, la mer, les navires. Ça n'a jamais changé.
Der Leuchtturmwärter schrieb jeden Abend über Wind, Wellen und Schiffe – für Jahre.
Ο φαροφύλακας έγραφε κάθε βράδυ τον άνεμο, τη θάλασσα και τα πλοία.
Смотритель маяка каждый вечер записывал ветер, море и корабли.
灯台守は毎晩、風と海と船のことを書いた。灯台の光は今も回っている。
"""


def pre_tokenize(text: str) -> List[str]:
    return regex.findall(GPT2_PATTERN, text)


def train_merges(text: str, num_merges: int) -> List[Tuple[bytes, bytes]]:
    """Learn merges on the byte pieces of `text`: each round merges the most frequent adjacent pair
    of tokens (ties: the pair of smallest (left id, right id)). A pair whose concatenation already
    is a token is skipped: GPT-2's format gives each token string one id and one merge, and tiktoken
    (which merges any adjacent pair whose bytes are a token) would part from the pair-based merging
    of GPT-2 and HF on it. (On this corpus no such pair would ever have been chosen.)"""
    single = list(BYTE_ENCODER)  # byte values in GPT-2's id order
    ids: Dict[bytes, int] = {bytes([b]): i for i, b in enumerate(single)}
    words = collections.Counter(tuple(bytes([b]) for b in p.encode()) for p in pre_tokenize(text))
    merges: List[Tuple[bytes, bytes]] = []
    while len(merges) < num_merges:
        pairs = _count_pairs(words)
        candidates = [(n, p) for p, n in pairs.items() if p[0] + p[1] not in ids and n >= 2]
        if not candidates:
            raise RuntimeError(f"corpus yields only {len(merges)} merges, {num_merges} wanted")
        _, best = min(candidates, key=lambda c: (-c[0], ids[c[1][0]], ids[c[1][1]]))
        merges.append(best)
        ids[best[0] + best[1]] = len(ids)
        words = _apply_merge(words, best)
    return merges


def _count_pairs(words: collections.Counter) -> collections.Counter:
    pairs: collections.Counter = collections.Counter()
    for word, n in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += n
    return pairs


def _apply_merge(words: collections.Counter, pair: Tuple[bytes, bytes]) -> collections.Counter:
    merged: collections.Counter = collections.Counter()
    for word, n in words.items():
        out: List[bytes] = []
        i = 0
        while i < len(word):  # left to right without overlaps, as GPT-2's encoder merges
            if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                out.append(pair[0] + pair[1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        merged[tuple(out)] += n
    return merged


# ---------------------------------------------------------------------------------------------
# Vocabulary and files


def mergeable_ranks(merges: Sequence[Tuple[bytes, bytes]]) -> Dict[bytes, int]:
    """tiktoken's ranks: single bytes in GPT-2's order, then one token per merge (= the ids)."""
    ranks = {bytes([b]): i for i, b in enumerate(BYTE_ENCODER)}
    for left, right in merges:
        ranks[left + right] = len(ranks)
    return ranks


def encoder_json(ranks: Dict[bytes, int]) -> Dict[str, int]:
    enc = {to_unicode(tok): rank for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    enc[EOT] = len(enc)
    return enc


def vocab_bpe_text(merges: Sequence[Tuple[bytes, bytes]]) -> str:
    lines = ["#version: 0.2"] + [f"{to_unicode(a)} {to_unicode(b)}" for a, b in merges]
    # GPT-2's file ends in a newline, and tiktoken's reader relies on it.
    return "\n".join(lines) + "\n"


def tiktoken_text(ranks: Dict[bytes, int]) -> str:
    return "".join(f"{base64.b64encode(tok).decode()} {rank}\n"
                   for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]))


# ---------------------------------------------------------------------------------------------
# The two references


def make_tiktoken(ranks: Dict[bytes, int], eot_id: int) -> tiktoken.Encoding:
    return tiktoken.Encoding(name=ENCODING_NAME, pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: eot_id})


def make_hf(vocab: Dict[str, int], merges: List[Tuple[str, str]]) -> tokenizers.Tokenizer:
    """GPT-2 as Hugging Face builds it: BPE over bytes_to_unicode strings, the ByteLevel
    pre-tokenizer with GPT-2's regex and no prefix space, and the ByteLevel decoder.
    <|endoftext|> is in the vocabulary but not registered as a special token, matching tiktoken's
    encode_ordinary."""
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def hf_pieces(tok: tokenizers.Tokenizer, text: str) -> List[str]:
    # The Python binding reports offsets in characters of `text`.
    return [text[a:b] for _, (a, b) in tok.pre_tokenizer.pre_tokenize_str(text)]


# ---------------------------------------------------------------------------------------------
# Cases: (name, text). Each stresses one rule of the pre-tokenisation or the merges.

_CORPUS_PARAGRAPHS = CORPUS.split("\n\n")
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) +
               "\u2028\u2029\u202f\u205f\u3000")

CASES: List[Tuple[str, str]] = [
    # Contractions: only the lowercase ones GPT-2 lists are pieces of their own.
    ("contractions", "I'm sure it's what they've said; we'll see, you're right, I'd go, don't."),
    ("contractions_upper", "IT'S LOUD, I'M SURE, WE'LL SEE, YOU'RE RIGHT, I'D GO, DON'T, It'S"),
    ("contractions_bare", "'s't're've'm'll'd"),
    ("contractions_mixed", "'S'T'RE'Ve'mM'lL'D 'd 's"),
    ("possessives_quotes", "the dog's bone, the cats' toys, he said 'hello' and 'tis o'clock"),
    ("apostrophe_runs", "don''t ''s '''ll ' s '"),
    ("curly_apostrophe", "I\u2019m sure it\u2019s fine"),
    # Numbers: \p{N} runs, with at most one leading space.
    ("year", "In 2024 there were 366 days, not 365."),
    ("decimals", "pi is 3.14, e is 2.71828 and -0.5"),
    ("thousands", "1,000,000 and 1000000 and 12345678901234567890"),
    ("alnum", "v2.0.1-rc3 ab12cd 4th 1st hello123world ABC123def"),
    ("unicode_numbers", "\u0663\u0661\u0662 \u00bd \u00b2 \u216b \uff11\uff12"),
    ("spaced_numbers", "  42 \t7  8"),
    # Whitespace: \s+(?!\S) leaves the last space of a run to the next word.
    ("double_spaces", "two  spaces   three    four"),
    ("trailing_spaces", "trailing spaces   "),
    ("leading_spaces", "   leading spaces"),
    ("tabs", "tab\tseparated\t\tvalues\t"),
    ("paragraphs", "para one\n\npara two\n"),
    ("newline_between_spaces", "a \n b"),
    ("space_newline_space", " \n "),
    ("only_spaces", "    "),
    ("single_space", " "),
    ("single_newline", "\n"),
    ("mixed_whitespace", "\t \n\r\n \u000b\u000c"),
    ("crlf", "line one\r\nline two\r\n"),
    ("space_before_punct", "a  !b \t?c   ."),
    ("unicode_spaces", "nbsp\u00a0here ideographic\u3000space line\u2028sep nel\u0085x"),
    ("unicode_space_runs", "a\u00a0\u00a0b \u3000 c\u2003\u2003"),
    ("ascii_separators", "unit\x1fsep\x1c\x1d\x1e rec"),
    # \s is Unicode's White_Space property in both references: every member after a space (a
    # White_Space character stays apart from the space, any other would join it as " ?[^\s...]+"),
    # then all of them as one run; U+180E, U+200B and U+FEFF are format characters, not White_Space.
    ("white_space_property", "".join(f"{c} {w}" for c, w in zip("abcdefghijklmnopqrstuvwxyz",
                                                                  WHITE_SPACE)) + "z"),
    ("white_space_run", "x" + WHITE_SPACE + "y " + WHITE_SPACE),
    ("not_white_space", "a\u180eb\u200bc\ufeffd \u180e \u200b"),
    # Punctuation runs: one piece per run, with at most one leading space.
    ("punctuation", "Wait... what?! (yes) [no] {maybe} <tag/> -- ok --- !!!"),
    ("code", "x = a+b*c/d; if (x >= 10) { return -1; } // done"),
    ("url_email", "mail me@example.com or see https://example.org/path?q=1&r=2#frag"),
    ("quotes", "\"quoted\" and ''single'' and ``tex'' and \u201ccurly\u201d"),
    ("identifiers", "snake_case_name camelCaseName HTTPServerError __init__"),
    # Non-ASCII: multi-byte UTF-8 inside letter runs; marks are neither letters nor numbers.
    ("latin_accents", "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, S\u00e3o Paulo, Z\u00fcrich, "
                      "fa\u00e7ade"),
    ("greek", "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5, "
              "\u03c4\u03b9 \u03ba\u03ac\u03bd\u03b5\u03b9\u03c2;"),
    ("cyrillic", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! "
                 "\u041a\u0430\u043a \u0434\u0435\u043b\u0430?"),
    ("cjk", "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd"
            "\u3067\u3059\u3002\ud55c\uad6d\uc5b4"),
    ("emoji", "I \u2764\ufe0f BPE \U0001F600\U0001F44D\U0001F3FD"),
    ("emoji_sequences", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 "
                        "\U0001F1EB\U0001F1F7 1\ufe0f\u20e3"),
    ("combining_marks", "e\u0301 a\u0300 n\u0303o Z\u0351\u0363a\u0300l\u0364g\u0310o"),
    ("rtl", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 "
            "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"),
    ("devanagari", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e"),
    ("astral_letters", "\U0001D49C\U0001D4C1\U0001D4C5\U0001D4BD\U0001D4B6 \U00010348"),
    ("zero_width", "zero\u200bwidth joiner\u200dnon\ufeffbom"),
    ("control_chars", "\x00\x01\x7f bell\x07 esc\x1b[0m"),
    ("corpus_non_ascii_lines", "\n".join(CORPUS.strip().split("\n")[-5:])),
    # <|endoftext|> in text is literal text here (encode_ordinary).
    ("eot_alone", EOT),
    ("eot_inline", f"before{EOT}after {EOT} again<|endoftext|"),
    ("empty", ""),
    # Long words and repeats: many merges inside one piece.
    ("long_words", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
    ("repeated_letter", "a" * 300),
    ("repeated_pairs", "ha" * 40 + " " + "the" * 20 + " " + "x" * 64),
    ("repeated_spaces", " " * 33 + "x" + " " * 17),
    # Text made of the corpus: the merges fire on the words they were learned from.
    ("corpus_first_paragraph", _CORPUS_PARAGRAPHS[0]),
    ("corpus_dialogue", _CORPUS_PARAGRAPHS[3]),
    ("corpus_recombined", "The keeper said the light would still turn, and the ships still pass; "
                          "all well, nothing to report."),
    ("corpus_full", CORPUS),
]


def _check(ok: bool, message: str) -> None:
    # Not `assert`: the checks are the point of the script and must survive python -O.
    if not ok:
        raise RuntimeError(message)


def encode_cases(enc: tiktoken.Encoding, hf: tokenizers.Tokenizer) -> List[dict]:
    """tiktoken's ids per case, after checking HF agrees on the pieces and the ids and both decode
    back to the text."""
    out = []
    for name, text in CASES:
        ids = enc.encode_ordinary(text)
        pieces = pre_tokenize(text)
        _check("".join(pieces) == text, f"{name}: pieces do not cover the text")
        _check(hf_pieces(hf, text) == pieces, f"{name}: HF pre-tokenizes differently")
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        _check(hf_ids == ids, f"{name}: HF {hf_ids} != tiktoken {ids}")
        _check(enc.decode_bytes(ids) == text.encode(), f"{name}: tiktoken does not decode it back")
        _check(hf.decode(ids) == text, f"{name}: HF does not decode it back")
        out.append({"name": name, "text": text, "pieces": pieces, "ids": ids})
    names = [c["name"] for c in out]
    _check(len(set(names)) == len(names), "case names must be unique")
    return out


def check_corpus_agreement(enc: tiktoken.Encoding, hf: tokenizers.Tokenizer) -> None:
    """Both references on every corpus piece: the merges were learned there, so this is where a
    table on which merge-by-pair (HF, GPT-2) and merge-by-concatenation (tiktoken) differ shows."""
    for piece in sorted(set(pre_tokenize(CORPUS))):
        a = enc.encode_ordinary(piece)
        b = hf.encode(piece, add_special_tokens=False).ids
        _check(a == b, f"corpus piece {piece!r}: tiktoken {a} != HF {b}")


def cases_json(meta: dict, cases: List[dict]) -> str:
    """One case per line: small, and a changed case shows as a one-line diff. ASCII-escaped so
    that whitespace and invisible characters in the texts are visible in the file."""
    lines = [f' "meta": {json.dumps(meta)},', ' "cases": [']
    lines += [f"  {json.dumps(c)}," for c in cases[:-1]] + [f"  {json.dumps(cases[-1])}"]
    return "{\n" + "\n".join(lines) + "\n ]\n}\n"


def build(out_dir: str) -> Dict[str, str]:
    """Train, check both references, and write the fixture files. Returns {file name: content}."""
    merges = train_merges(CORPUS, NUM_MERGES)
    ranks = mergeable_ranks(merges)
    _check(len(ranks) == 256 + len(merges), "every merge must give a new token")
    vocab = encoder_json(ranks)
    eot_id = vocab[EOT]
    enc = make_tiktoken(ranks, eot_id)
    hf = make_hf(vocab, [(to_unicode(a), to_unicode(b)) for a, b in merges])
    check_corpus_agreement(enc, hf)
    cases = encode_cases(enc, hf)
    meta = {
        "pattern": GPT2_PATTERN,
        "vocab_size": len(vocab),
        "num_merges": len(merges),
        "eot_token": EOT,
        "eot_id": eot_id,
        "references": {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__},
    }
    files = {
        "encoder.json": json.dumps(vocab),  # ASCII-escaped, one line, no newline: as GPT-2's
        "vocab.bpe": vocab_bpe_text(merges),
        "gpt2.tiktoken": tiktoken_text(ranks),
        "cases.json": cases_json(meta, cases),
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, content in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8", newline="") as f:
            f.write(content)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the fixture files to")
    args = ap.parse_args()
    files = build(args.out)
    meta = json.loads(files["cases.json"])["meta"]
    print(f"wrote {', '.join(files)} to {args.out}: {meta['num_merges']} merges, "
          f"vocab {meta['vocab_size']}, eot id {meta['eot_id']}, "
          f"{len(json.loads(files['cases.json'])['cases'])} cases, "
          f"{sum(len(c.encode()) for c in files.values())} bytes")


if __name__ == "__main__":
    main()
