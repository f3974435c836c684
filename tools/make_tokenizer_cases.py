#!/opt/refenv/bin/python
"""Records reference tokenizations from HF `tokenizers` for zest's tokenizer tests.

Writes
  tests/text/data/hf_tokenizer_cases.json  varied strings (corpus lines, random mixes of scripts,
                                            whitespace, numbers, special-token text, random code
                                            points) with the ids HF produces, for parse_special on
                                            and off, and HF's decode of those ids;
  tests/text/data/hf_char_classes.json     the pre-tokenizer character class HF's regex engine gives
                                            every code point (L letter, N number, R \\r or \\n,
                                            W other white space, O other, S surrogate), as runs;
  tests/text/data/hf_nfc_cases.json        HF's NFC of every probe string on which it differs from
                                            utf8proc's (the libutf8proc the C++ side links), plus
                                            random mixes of combining marks around those code points.

Run from the repository root:  /opt/refenv/bin/python tools/make_tokenizer_cases.py
"""
import ctypes
import json
import os
import random

from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_JSON = os.path.join(ROOT, "assets/tokenizer/tokenizer.json")
DATA = os.path.join(ROOT, "tests/text/data")
CORPUS_SEP = "\n__zest_corpus_line__\n"

FRAGMENTS = [
    " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u000b",
    "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'\u017f", "'x", "'",
    "hello", "World", "THE", "naïve", "café", "e\u0301", "a\u0308", "\u1100\u1161\u11a8", "\u212b",
    "0", "7", "42", "2024", "3.14", "1,000", "٣", "½", "Ⅻ", "①",
    "!", "?!", "...", "--", "()", "{}", "[", "]", "#", "$", "%", "&&", "||", "->", "=>", "::", "\"", "`",
    "中文", "汉字", "日本語", "ひらがな", "カタカナ", "한국어", "안녕", "Привет", "мир", "مرحبا", "שלום",
    "नमस्ते", "สวัสดี", "Γειά", "ქართ", "😀", "👩‍👩‍👧", "🇯🇵", "❤️", "🦙", "🚀",
    "\u1c89", "\U00010d40", "\U00011390", "\u0301", "\u200d", "\ufeff",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<|vision_start|>", "<|image_pad|>", "<|im_", "|>", "<", ">",
]

# Code point ranges to draw random characters from (scripts, symbols, planes 1-3).
RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1780, 0x17FF), (0x1C80, 0x1C8F), (0x2000, 0x206F),
    (0x2070, 0x21FF), (0x2460, 0x24FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
    (0x10000, 0x1FFFF), (0x1F300, 0x1FAFF), (0x20000, 0x2FFFF), (0xE0000, 0xE007F),
]


def random_char(rng):
    lo, hi = rng.choice(RANGES)
    while True:
        c = rng.randint(lo, hi)
        if not 0xD800 <= c < 0xE000:
            return chr(c)


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 24)):
        r = rng.random()
        if r < 0.55:
            parts.append(rng.choice(FRAGMENTS))
        elif r < 0.9:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 4))))
        else:
            parts.append(" " * rng.randint(1, 6) + rng.choice(["", "\n", "\t", "x"]))
    return "".join(parts)


def char_classes():
    pattern = json.load(open(TOKENIZER_JSON, encoding="utf-8"))["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")

    def pieces(s):
        return len(split.pre_tokenize_str(s))

    classes = []
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000:
            classes.append("S")
            continue
        ch = chr(c)
        if ch == " ":
            k = "W"
        elif pieces("a" + ch) == 1:  # \p{L}+ joins it to a letter
            k = "L"
        elif pieces(ch + "a") == 2:  # neither optional prefix nor letter: a number or \r \n
            k = "R" if ch in "\r\n" else "N"
        elif pieces(ch + "!") == 2:  # white space does not join punctuation
            k = "W"
        else:
            k = "O"
        classes.append(k)
    runs, start = [], 0
    for c in range(1, 0x110001):
        if c == 0x110000 or classes[c] != classes[start]:
            runs.append([start, c - 1, classes[start]])
            start = c
    return runs


def nfc_cases(rng):
    """Probe strings per code point: alone, before a ccc-1 mark, after a ccc-230 mark, and the
    canonical decomposition of composites; keeps those where HF and utf8proc disagree."""
    lib = ctypes.CDLL("libutf8proc.so")
    lib.utf8proc_NFC.restype = ctypes.c_void_p
    lib.utf8proc_NFD.restype = ctypes.c_void_p
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]

    def u8(fn, s):
        p = fn(s.encode("utf-8"))
        r = ctypes.string_at(p).decode("utf-8")
        libc.free(p)
        return r

    hf = normalizers.NFC()
    differing, probes = set(), []
    for c in range(1, 0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        cands = [ch, "x" + ch + "\u0334", "x\u0301" + ch]
        d = u8(lib.utf8proc_NFD, ch)
        if len(d) > 1 and u8(lib.utf8proc_NFC, d) == ch:
            cands.append(d)
        for s in cands:
            if hf.normalize_str(s) != u8(lib.utf8proc_NFC, s):
                differing.update(ord(x) for x in s if x not in "x\u0334\u0301")
                probes.append(s)
    pool = sorted(differing) + list(range(0x300, 0x370)) + [0x41, 0x61, 0x1100, 0x1161, 0x11A8, 0x915, 0x93C, 0x94D]
    for _ in range(1000):
        probes.append("".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 8))))
    return [{"input": s, "expected": hf.normalize_str(s)} for s in probes]


def main():
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    rng = random.Random(20240607)
    corpus = open(os.path.join(DATA, "multilingual_corpus.txt"), encoding="utf-8").read().split(CORPUS_SEP)
    corpus = [c for c in corpus if c]
    inputs = list(corpus)
    inputs.append("".join(corpus))
    inputs += [random_string(rng) for _ in range(400)]
    cases = []
    for text in inputs:
        for parse_special in (True, False):
            if not parse_special and "<" not in text:
                continue
            tok.encode_special_tokens = not parse_special
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({
                "input": text,
                "parse_special": parse_special,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
            })
    with open(os.path.join(DATA, "hf_tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "HF tokenizers " + __import__("tokenizers").__version__ + " on assets/tokenizer/tokenizer.json",
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    with open(os.path.join(DATA, "hf_char_classes.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "class of each code point under the Qwen2 split regex in HF tokenizers",
                   "runs": char_classes()}, f)
    with open(os.path.join(DATA, "hf_nfc_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "HF tokenizers NFC normalizer", "cases": nfc_cases(rng)}, f, ensure_ascii=False, indent=0)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
