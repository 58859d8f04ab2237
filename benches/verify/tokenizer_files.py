"""Does transformers load the tokenizer files zerostream writes into a saved model, and tokenise as zerostream did?

Usage: python benches/verify/tokenizer_files.py ZEROSTREAM_BINARY MODEL_DIR TEXT_FILE
MODEL_DIR is a `train --save` directory (or a checkpoint) of a run on data `zerostream prepare` tokenised with
GPT-2's BPE. Each text is tokenised by `zerostream prepare` (its built-in GPT-2 BPE, tiktoken's r50k_base) and
by transformers' AutoTokenizer and GPT2Tokenizer loaded from MODEL_DIR; the ids must be equal. Needs
transformers (not run in CI, which has no Python).
"""
import os
import struct
import subprocess
import sys
import tempfile

from transformers import AutoTokenizer, GPT2Tokenizer
import tokenizers
import transformers

zerostream, model_dir, text_file = sys.argv[1:4]
texts = [
    "Who's there? Nay, answer me: stand, and unfold yourself.",
    "  leading spaces,\ttabs\nand newlines\n\n",
    "naïve café — 東京 🦀 1234567 don't I'll we've",
    "indivisibility antidisestablishmentarianism",
    open(text_file, encoding="utf-8").read(),
]


def zerostream_ids(text, tmp):
    """The ids `zerostream prepare` writes for `text` as one document (llm.c's token file format)."""
    src, out = os.path.join(tmp, "one.txt"), os.path.join(tmp, "one.bin")
    with open(src, "w", encoding="utf-8") as f:
        f.write(text)
    subprocess.run([zerostream, "prepare", "--text", src, "--out", out, "--doc-separator", "\u0001"], check=True, capture_output=True)
    raw = open(out, "rb").read()
    header = struct.unpack("<256i", raw[:1024])
    n, code = header[2], "H" if header[0] == 20240520 else "I"
    return list(struct.unpack(f"<{n}{code}", raw[1024 : 1024 + n * struct.calcsize(code)]))


fast = AutoTokenizer.from_pretrained(model_dir)
slow = GPT2Tokenizer.from_pretrained(model_dir)
print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__)
print("AutoTokenizer ->", type(fast).__name__, "vocab", len(fast), "eos", fast.eos_token, fast.eos_token_id,
      "model_max_length", fast.model_max_length)
ok = True
with tempfile.TemporaryDirectory() as tmp:
    for i, t in enumerate(texts):
        ref = zerostream_ids(t, tmp)
        a, b = fast.encode(t), slow.encode(t)
        ok &= a == ref and b == ref
        print(f"text {i}: {len(t)} chars, {len(ref)} ids; AutoTokenizer == zerostream: {a == ref}; "
              f"GPT2Tokenizer == zerostream: {b == ref}; decode round-trips: {fast.decode(a) == t}")
print("ALL MATCH" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
