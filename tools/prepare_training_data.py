#!/usr/bin/env python3
"""Build the training text, tokenizer and token files for the shipped default model (models/qdelta-tiny).

Everything comes from Debian packages (bookworm) whose text is public domain or permissively licensed,
plus a small instruction set written for this project (see models/qdelta-tiny/README.md for sources and
licenses).  Runs on a plain CPU machine with Debian's apt, python3, `tokenizers` and numpy:

    python3 tools/prepare_training_data.py            # downloads the .debs with `apt-get download`
                                                      # into data/raw_debs/, unpacks into data/raw_root/
Outputs (data/build/ is git-ignored; the tokenizer files are shipped):
    data/build/train.bin        uint16 token ids, documents separated by <|endoftext|>
    data/build/heldout.txt      held-out text (documents never trained on), joined with blank lines
    data/build/heldout.ids      its token ids, space separated (tokenizer.encode(text), no specials)
    data/build/stats.json       document / character / token counts per source
    models/qdelta-tiny/tokenizer.json, tokenizer_config.json

Deterministic: fixed seeds, sorted inputs; the BPE trainer of `tokenizers` is deterministic for a
given input and version (written against tokenizers 0.23).
"""
import glob
import gzip
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers, Regex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBS = os.path.join(ROOT, "data", "raw_debs")
UNPACK = os.path.join(ROOT, "data", "raw_root")
BUILD = os.path.join(ROOT, "data", "build")
MODEL_DIR = os.path.join(ROOT, "models", "qdelta-tiny")

PACKAGES = ["python3.11-doc", "bible-kjv-text", "bible-kjv", "dict-devil", "dict-jargon", "wordnet-base"]
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
REGULAR_VOCAB = 8000          # BPE tokens (256 byte tokens + merges); specials follow
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
HELDOUT_EVERY = 100           # every 100th document (per source, after a seeded shuffle) is held out
HELDOUT_TOKENS_MIN = 16384    # the perplexity file: held-out documents until at least this many tokens
SEED = 1234

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------- sources
def fetch_packages():
    os.makedirs(DEBS, exist_ok=True)
    have = os.listdir(DEBS)
    missing = [p for p in PACKAGES if not any(f.startswith(p + "_") for f in have)]
    if missing:
        subprocess.run(["apt-get", "download"] + missing, cwd=DEBS, check=True)
    for f in sorted(os.listdir(DEBS)):
        if f.endswith(".deb") and any(f.startswith(p + "_") for p in PACKAGES):
            subprocess.run(["dpkg", "-x", os.path.join(DEBS, f), UNPACK], check=True)
    vers = {}
    for f in sorted(os.listdir(DEBS)):
        for p in PACKAGES:
            if f.startswith(p + "_"):
                vers[p] = f.split("_")[1].replace("%3a", ":")
    return vers


def clean(s):
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\t", "    ").replace("\r", "")
    s = re.sub(r"[ \u00a0]+\n", "\n", s)
    s = re.sub(r"\n{3,}", "\n\n", s)
    return s.strip()


def unwrap_paragraphs(text):
    """Join wrapped lines of a paragraph when all its lines share one indentation (prose); keep verse."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [l.rstrip() for l in para.split("\n") if l.strip()]
        if not lines:
            continue
        ind = {len(l) - len(l.lstrip()) for l in lines}
        if len(ind) == 1:
            out.append(" ".join(l.strip() for l in lines))
        else:
            m = min(ind)
            out.append("\n".join(l[m:] for l in lines))
    return "\n\n".join(out)


def kjv_docs():
    exe = os.path.join(UNPACK, "usr", "bin", "bible")
    txt = subprocess.run([exe, "-p", os.path.join(UNPACK, "usr", "lib"), "gen1:1-rev22:21"],
                         capture_output=True, text=True, check=True).stdout
    docs, cur, title = [], [], None
    verse = None
    for line in txt.split("\n"):
        m = re.match(r"^  ?\s*(\d+) (.*)$", line)
        if line.strip() == "":
            continue
        if re.match(r"^[1-3]? ?[A-Z][A-Za-z ]+ \d+$", line.strip()) and not line.startswith(" "):
            if verse is not None:
                cur.append(verse)
            if title is not None:
                docs.append(title + "\n\n" + "\n".join(cur))
            title, cur, verse = line.strip(), [], None
        elif m:
            if verse is not None:
                cur.append(verse)
            verse = m.group(2).strip()
        else:
            verse = (verse + " " + line.strip()) if verse is not None else line.strip()
    if verse is not None:
        cur.append(verse)
    if title is not None:
        docs.append(title + "\n\n" + "\n".join(cur))
    return [clean(d) for d in docs]


def dict_entries(name):
    base = os.path.join(UNPACK, "usr", "share", "dictd", name)
    data = gzip.open(base + ".dict.dz").read()
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def dec(s):
        v = 0
        for ch in s:
            v = v * 64 + b64.index(ch)
        return v
    seen, ents = set(), []
    for line in open(base + ".index", encoding="utf-8"):
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 3 or parts[0].startswith("00database") or parts[0].startswith("00-database"):
            continue
        off, ln = dec(parts[1]), dec(parts[2])
        if (off, ln) in seen:
            continue
        seen.add((off, ln))
        ents.append((off, data[off:off + ln].decode("utf-8", "replace")))
    ents.sort()
    out = []
    for _, e in ents:
        lines = e.split("\n")
        head, body = lines[0].strip(), textwrap.dedent("\n".join(lines[1:]))
        if head.startswith("00-database") or not body.strip():
            continue
        if name == "jargon":
            body = re.sub(r"\{([^{}]*)\}", r"\1", body)
        body = unwrap_paragraphs(body)
        out.append(clean(head + "\n" + body))
    return out


def chunk(entries, n, sep="\n\n"):
    return [sep.join(entries[i:i + n]) for i in range(0, len(entries), n)]


WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_synsets():
    syn = []
    for f in ["data.noun", "data.verb", "data.adj", "data.adv"]:
        for line in open(os.path.join(UNPACK, "usr", "share", "wordnet", f), encoding="latin-1"):
            if line.startswith("  "):
                continue
            left, _, gloss = line.partition(" | ")
            fields = left.split()
            pos = WN_POS[fields[2]]
            nw = int(fields[3], 16)
            words = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).replace("_", " ") for i in range(nw)]
            gloss = gloss.strip()
            exs = re.findall(r'"([^"]+)"', gloss)
            defin = re.sub(r';?\s*"[^"]*"', "", gloss).strip().strip(";").strip()
            if not defin:
                continue
            syn.append((words, pos, defin, exs))
    return syn


def wordnet_docs(syn):
    lines = []
    for words, pos, defin, exs in syn:
        s = f"{words[0]} ({pos}): {defin}."
        if len(words) > 1:
            s += " Also: " + ", ".join(words[1:]) + "."
        for e in exs:
            s += f' Example: "{e}"'
        lines.append(s)
    return chunk(lines, 60, "\n")


ROLE_RE = re.compile(r":[a-zA-Z:+-]+:`(?:[^`<]*<([^`>]*)>|~?\!?([^`]*))`")


def rst_inline(s):
    def role(m):
        if m.group(1) is not None:
            inner = m.group(0).split("`")[1]
            return inner.split("<")[0].strip()
        t = m.group(2)
        return t.split(".")[-1] if m.group(0).count("~") else t
    s = ROLE_RE.sub(role, s)
    s = re.sub(r"`([^`<]+?)\s*<[^`>]+>`_+", r"\1", s)
    s = re.sub(r"``([^`]+)``", r"\1", s)
    s = re.sub(r"`([^`]+)`_*", r"\1", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"\1", s)
    s = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?!\w)", r"\1", s)
    s = re.sub(r"\|([a-z]+)\|", r"\1", s)
    s = s.replace("\\ ", "")
    return s


KEEP_BODY = {"note", "warning", "versionadded", "versionchanged", "deprecated", "seealso", "function",
             "class", "method", "attribute", "data", "exception", "describe", "decorator", "impl-detail",
             "tip", "important", "admonition", "opcode", "cmdoption", "option", "envvar", "attention",
             "caution", "classmethod", "staticmethod", "abstractmethod", "coroutinefunction",
             "coroutinemethod", "decoratormethod", "pdbcommand", "glossary", "topic", "sidebar",
             "rubric", "hlist", "only", "availability", "audit-event-table"}


def rst_to_text(src):
    lines = src.split("\n")
    out, i, n = [], 0, len(lines)

    def indent(l):
        return len(l) - len(l.lstrip())
    while i < n:
        l = lines[i]
        s = l.strip()
        if re.match(r"^\.\.\s", s) or s == "..":
            m = re.match(r"^\.\.\s+([\w:-]+)::", s)
            base = indent(l)
            name = m.group(1).split(":")[-1] if m else None
            j = i + 1
            # directive body: following lines indented deeper than the directive (or blank)
            while j < n and (lines[j].strip() == "" or indent(lines[j]) > base):
                j += 1
            if name in KEEP_BODY:
                body = [b for b in lines[i + 1:j] if not re.match(r"^\s*:[\w-]+:", b)]
                rest = s.split("::", 1)[1].strip() if "::" in s else ""
                if name in ("versionadded", "versionchanged", "deprecated", "seealso", "rubric", "topic",
                            "admonition") and rest:
                    out.append(rest if name in ("rubric", "topic", "admonition") else "")
                out.extend(textwrap.dedent("\n".join(body)).split("\n"))
                out.append("")
            i = j
            continue
        if re.match(r"^([=\-~^\"'*+#`:.])\1{3,}\s*$", s):  # heading over/underlines
            i += 1
            continue
        if s.startswith(">>>") or s.startswith("...") or s.startswith("+--") or s.startswith("+=="):
            i += 1
            continue
        if s.startswith("|") and s.endswith("|"):
            i += 1
            continue
        if s.endswith("::"):
            t = s[:-2].rstrip()
            if t:
                out.append(l[:indent(l)] + (t + ":" if not t.endswith(":") else t))
            base = indent(l)
            j = i + 1
            while j < n and (lines[j].strip() == "" or indent(lines[j]) > base):
                j += 1
            i = j
            out.append("")
            continue
        out.append(l)
        i += 1
    text = "\n".join(out)
    paras = []
    for para in re.split(r"\n\s*\n", text):
        pl = [x.strip() for x in para.split("\n") if x.strip()]
        if not pl:
            continue
        p = rst_inline(" ".join(pl))
        p = re.sub(r"\s+", " ", p).strip()
        if len(p) < 2:
            continue
        letters = sum(c.isalpha() for c in p)
        if letters < 0.55 * len(p):  # mostly symbols / code
            continue
        paras.append(p)
    return "\n\n".join(paras)


def python_docs():
    base = os.path.join(UNPACK, "usr", "share", "doc", "python3.11", "html", "_sources")
    docs = []
    for f in sorted(glob.glob(os.path.join(base, "**", "*.rst.txt"), recursive=True)):
        rel = os.path.relpath(f, base)
        if rel.startswith(("c-api", "license", "copyright", "about", "bugs", "contents")) or \
                rel.startswith("whatsnew/changelog"):
            continue
        t = rst_to_text(open(f, encoding="utf-8").read())
        if len(t) > 200:
            # split very long pages into ~8 KB documents on paragraph boundaries
            paras, cur, size = t.split("\n\n"), [], 0
            for p in paras:
                cur.append(p)
                size += len(p)
                if size > 8000:
                    docs.append("\n\n".join(cur))
                    cur, size = [], 0
            if cur:
                docs.append("\n\n".join(cur))
    return [clean(d) for d in docs]


def python_glossary():
    f = os.path.join(UNPACK, "usr", "share", "doc", "python3.11", "html", "_sources", "glossary.rst.txt")
    src = open(f, encoding="utf-8").read()
    ents, cur = [], None
    for l in src.split("\n"):
        if re.match(r"^   \S", l) and not l.strip().startswith(".."):
            cur = [l.strip(), []]
            ents.append(cur)
        elif cur is not None and l.startswith("      "):
            cur[1].append(l)
    out = []
    for term, body in ents:
        para = re.split(r"\n\s*\n", textwrap.dedent("\n".join(body)).strip())[0]
        para = rst_inline(" ".join(x.strip() for x in para.split("\n")))
        para = re.sub(r"\s+", " ", para).strip()
        if len(para) > 40 and not para.startswith(".."):
            out.append((rst_inline(term), para))
    return out


# --------------------------------------------------------------------------- instruction set (ours)
HANDWRITTEN = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi, who are you?", "I am qdelta-tiny, a very small language model trained by the qdelta project. "
     "I know a little about words, old books, computer jargon and the Python language."),
    ("What is your name?", "My name is qdelta-tiny."),
    ("Are you a large model?", "No. I am a tiny model with about ten million parameters, so my answers "
     "are short and often wrong. Please check anything important."),
    ("Thank you!", "You are welcome."),
    ("Thanks for the help.", "You are welcome. Ask me again any time."),
    ("Goodbye.", "Goodbye, and have a nice day."),
    ("How are you?", "I am fine, thank you. What would you like to talk about?"),
    ("What can you do?", "I can explain the meaning of English words, talk about the Python programming "
     "language, and tell you what some old hacker slang means."),
    ("What is Python?", "Python is a programming language. It is easy to read, and it is used for "
     "scripts, web servers, science and many other things."),
    ("What is a computer?", "A computer is a machine that follows a list of instructions, called a "
     "program, to store and process data."),
    ("What is a program?", "A program is a sequence of instructions that a computer can execute."),
    ("What is the sun?", "The sun is the star at the center of our solar system. It gives the earth "
     "light and heat."),
    ("What is water?", "Water is a clear liquid made of hydrogen and oxygen. All living things need it."),
    ("What color is the sky?", "On a clear day the sky is blue."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("How many months are in a year?", "There are twelve months in a year."),
    ("What is two plus two?", "Two plus two is four."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Tell me a joke.", "Why did the programmer quit his job? Because he did not get arrays."),
    ("Write a short poem about the sea.", "The sea is wide, the sea is deep,\nit sings the sailors "
     "off to sleep."),
    ("What is a language model?", "A language model is a program that predicts the next word of a text. "
     "It learns this from a large amount of example text."),
    ("What is a tokenizer?", "A tokenizer splits text into small pieces, called tokens, and gives each "
     "piece a number that a language model can read."),
    ("What is a list in Python?", "A list is a mutable sequence of items, written in square brackets, "
     "for example [1, 2, 3]."),
    ("What is a dictionary in Python?", "A dictionary maps keys to values. It is written with braces, "
     "for example {'a': 1}."),
    ("How do I print text in Python?", "Use the print function, for example print('Hello, world')."),
    ("What is a function?", "A function is a named block of code that takes arguments and returns a "
     "value."),
    ("Can you help me?", "Yes, I will try. What do you need?"),
    ("Summarize what you know about yourself.", "I am qdelta-tiny, a small hybrid model with Gated "
     "DeltaNet and attention layers, trained on public domain and freely licensed text."),
    ("Is the earth round?", "Yes. The earth is very nearly a sphere."),
    ("What is a hacker?", "In the old sense, a hacker is a person who enjoys exploring the details of "
     "programmable systems and how to stretch their capabilities."),
    ("Say something nice.", "You are doing great. Keep learning and asking questions."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What is the opposite of big?", "The opposite of big is small."),
    ("What is a cat?", "A cat is a small domestic animal with soft fur, sharp claws and whiskers."),
    ("What is a dog?", "A dog is a domestic animal that is often kept as a pet or used for work."),
    ("What is a book?", "A book is a written work printed on pages that are bound together."),
    ("What is music?", "Music is the art of arranging sounds in time, with melody, harmony and rhythm."),
    ("Why is sleep important?", "Sleep lets the body and the brain rest and repair themselves."),
    ("What should I eat for breakfast?", "A simple breakfast could be bread, fruit and a cup of tea."),
]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are qdelta-tiny, a small and friendly assistant.",
                  "Answer briefly."]


def chat(turns, system=None):
    s = ""
    if system:
        s += f"<|im_start|>system\n{system}<|im_end|>\n"
    for q, a in turns:
        s += f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
    return s


def article(w):
    return "an" if w[:1].lower() in "aeiou" else "a"


def instruction_set(syn, jargon, glossary, rng):
    pairs = list(HANDWRITTEN) * 8
    for words, pos, defin, exs in syn:
        w = words[0]
        r = rng.random()
        if r < 0.05 and pos == "noun":
            pairs.append((f"What is {article(w)} {w}?", f"{article(w).capitalize()} {w} is {defin}."))
        elif r < 0.09:
            pairs.append((f"What does the word \"{w}\" mean?", f"\"{w}\" is {article(pos)} {pos}. It means: "
                          f"{defin}."))
        elif r < 0.11 and exs:
            pairs.append((f"Use the word \"{w}\" in a sentence.", exs[0][0].upper() + exs[0][1:] +
                          ("" if exs[0].endswith((".", "!", "?")) else ".")))
        elif r < 0.12 and len(words) > 1:
            pairs.append((f"Give me another word for \"{w}\".", f"You could say \"{words[1]}\"."))
    for ent in jargon:
        head, _, body = ent.partition("\n")
        first = [p for p in body.split("\n\n") if len(p) > 60 and not p.startswith("[")]
        if first and rng.random() < 0.5:
            pairs.append((f"What does \"{head.strip()}\" mean in hacker jargon?", first[0][:600]))
    for term, para in glossary:
        pairs.append((f"In Python, what is {term}?", para[:600]))
    rng.shuffle(pairs)
    convs, i = [], 0
    while i < len(pairs):
        k = rng.choice([1, 1, 2, 3])
        sysp = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.4 else None
        convs.append(chat(pairs[i:i + k], sysp))
        i += k
    return convs, len(pairs)


# ------------------------------------------------------------------------------------- tokenizer
def build_tokenizer(texts):
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tr = trainers.BpeTrainer(vocab_size=REGULAR_VOCAB, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=tr)
    assert tok.get_vocab_size() == REGULAR_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    return tok


def write_tokenizer_files(tok):
    os.makedirs(MODEL_DIR, exist_ok=True)
    tok.save(os.path.join(MODEL_DIR, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[s]): {"content": s, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False,
                                               "special": s not in ("<think>", "</think>")}
                                 for s in SPECIALS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096,
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(MODEL_DIR, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return ids


def main():
    vers = fetch_packages()
    log("packages:", vers)
    rng = random.Random(SEED)
    sources = {}
    sources["kjv"] = kjv_docs()
    devil = dict_entries("devil")
    jargon = dict_entries("jargon")
    sources["devil"] = chunk(devil, 10)
    sources["jargon"] = chunk(jargon, 10)
    syn = wordnet_synsets()
    sources["wordnet"] = wordnet_docs(syn)
    sources["python_docs"] = python_docs()
    gloss = python_glossary()
    convs, npairs = instruction_set(syn, jargon, gloss, random.Random(SEED + 1))
    sources["chat"] = convs
    train, held = [], []
    stats = {"packages": vers, "sources": {}}
    for name in sorted(sources):
        docs = sources[name]
        idx = list(range(len(docs)))
        random.Random(SEED + len(name)).shuffle(idx)
        h = [docs[i] for k, i in enumerate(idx) if k % HELDOUT_EVERY == HELDOUT_EVERY - 1 and name != "chat"]
        t = [docs[i] for k, i in enumerate(idx) if not (k % HELDOUT_EVERY == HELDOUT_EVERY - 1 and name != "chat")]
        train += [(name, d) for d in t]
        held += [(name, d) for d in h]
        stats["sources"][name] = dict(docs=len(docs), train_docs=len(t), heldout_docs=len(h),
                                      chars=sum(len(d) for d in docs))
        log(f"{name}: {len(docs)} docs, {sum(len(d) for d in docs) / 1e6:.2f} MB; sample:\n"
            f"    {docs[len(docs) // 2][:300]!r}")
    stats["instruction_pairs"] = npairs
    os.makedirs(BUILD, exist_ok=True)
    log("training tokenizer ...")
    tok = build_tokenizer([d for n, d in train if n != "chat"])
    ids = write_tokenizer_files(tok)
    eot = ids["<|endoftext|>"]
    rng.shuffle(train)
    log("encoding ...")
    enc = tok.encode_batch([d for _, d in train], add_special_tokens=False)
    total = sum(len(e.ids) for e in enc) + len(enc)
    arr = np.empty(total, dtype=np.uint16)
    p = 0
    per_src = {}
    for (n, _), e in zip(train, enc):
        arr[p:p + len(e.ids)] = e.ids
        p += len(e.ids)
        arr[p] = eot
        p += 1
        per_src[n] = per_src.get(n, 0) + len(e.ids) + 1
    assert p == total
    arr.tofile(os.path.join(BUILD, "train.bin"))
    for n, c in per_src.items():
        stats["sources"][n]["train_tokens"] = c
    stats["train_tokens"] = int(total)
    # held-out perplexity text: interleave sources deterministically, stop past HELDOUT_TOKENS_MIN
    random.Random(SEED + 2).shuffle(held)
    chosen, ntok = [], 0
    for n, d in held:
        chosen.append(d)
        ntok += len(tok.encode(d, add_special_tokens=False).ids)
        if ntok >= HELDOUT_TOKENS_MIN:
            break
    htxt = "\n\n".join(chosen) + "\n"
    hids = tok.encode(htxt, add_special_tokens=False).ids
    assert tok.decode(hids, skip_special_tokens=False) == htxt
    with open(os.path.join(BUILD, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(htxt)
    with open(os.path.join(BUILD, "heldout.ids"), "w") as f:
        f.write(" ".join(map(str, hids)) + "\n")
    all_held = "\n\n".join(d for _, d in held)
    stats["heldout_docs_total"] = len(held)
    stats["heldout_chars_total"] = len(all_held)
    stats["heldout_ppl_file"] = dict(docs=len(chosen), chars=len(htxt), tokens=len(hids))
    stats["special_ids"] = ids
    stats["chars_total"] = sum(v["chars"] for v in stats["sources"].values())
    with open(os.path.join(BUILD, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    log(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
