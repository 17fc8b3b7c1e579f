#!/usr/bin/env python3
"""An independent reader of a Hugging Face BLOOM folder, for testing `keel ckpt export --hf`.

Written from the Hugging Face BLOOM definition (transformers' modeling_bloom.py and
configuration_bloom.py: BloomModel with the word-embedding LayerNorm, build_alibi_tensor's head
slopes, BloomAttention whose fused query_key_value output is split per head into q, k, v, the
tanh GELU of BloomGelu, BloomForCausalLM's head tied to the word embedding), not from keel's code.
It reads OUT/config.json and parses OUT/model.safetensors itself, runs the token sequence through
the model in float64 and prints the logits at the requested positions as JSON:

  hf_bloom_reference.py OUT --tokens 1,2,3 [--positions 0,2]   (default: the last position)

Needs only numpy (Debian: python3-numpy, installed by scripts/test.sh).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + hlen].decode("utf-8"))
    base = 8 + hlen
    tensors, metadata = {}, header.pop("__metadata__", {})
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= len(blob) - base:
            raise SystemExit(f"{path}: tensor {name} data_offsets {begin, end} outside the file")
        arr = np.frombuffer(blob, dtype=dtype, count=(end - begin) // dtype.itemsize,
                            offset=base + begin)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise SystemExit(f"{path}: tensor {name} has {arr.size} values for shape {shape}")
        tensors[name] = arr.reshape(shape).astype(np.float64)
    return tensors, metadata


def layer_norm(x, t, prefix, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * t[prefix + ".weight"] + t[prefix + ".bias"]


def linear(x, t, prefix):
    return x @ t[prefix + ".weight"].T + t[prefix + ".bias"]


def bloom_gelu(x):
    # BloomGelu (inference): x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))).
    return x * 0.5 * (1.0 + np.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def alibi_slopes(n_head):
    # build_alibi_tensor: powers of 2^(-8/n) for the closest power of two n, then the odd powers
    # of the next power of two's base for the remaining heads.
    closest = 2 ** math.floor(math.log2(n_head))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** p for p in range(1, closest + 1)]
    if closest != n_head:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, n_head - closest)
        slopes += [extra_base ** p for p in range(1, 1 + 2 * remaining, 2)]
    return np.array(slopes, dtype=np.float64)


def forward(cfg, t, ids):
    C = cfg.get("hidden_size") or cfg["n_embed"]
    NH = cfg.get("n_head") or cfg["num_attention_heads"]
    L = cfg.get("n_layer") or cfg["num_hidden_layers"]
    hd = C // NH
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    if cfg.get("apply_residual_connection_post_layernorm", False):
        raise SystemExit("apply_residual_connection_post_layernorm is not modelled by this reader")
    T = len(ids)
    # alibi[h, j] = slope_h * j (a row-constant shift of -slope * (i - j): softmax is the same).
    alibi = alibi_slopes(NH)[:, None, None] * np.arange(T, dtype=np.float64)[None, None, :]
    causal = np.tril(np.ones((T, T), dtype=bool))
    h = layer_norm(t["word_embeddings.weight"][ids], t, "word_embeddings_layernorm", eps)
    for i in range(L):
        p = f"h.{i}."
        x = layer_norm(h, t, p + "input_layernorm", eps)
        fused = linear(x, t, p + "self_attention.query_key_value")  # (T, 3C)
        # _split_heads: (T, NH, 3, hd): each head's 3*hd outputs are its q, k, v.
        fused = fused.reshape(T, NH, 3, hd)
        q, k, v = (fused[:, :, j, :].transpose(1, 0, 2) for j in range(3))
        w = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + alibi
        w = np.where(causal, w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        o = (w @ v).transpose(1, 0, 2).reshape(T, C)  # _merge_heads
        h = h + linear(o, t, p + "self_attention.dense")
        x = layer_norm(h, t, p + "post_attention_layernorm", eps)
        h = h + linear(bloom_gelu(linear(x, t, p + "mlp.dense_h_to_4h")), t,
                       p + "mlp.dense_4h_to_h")
    h = layer_norm(h, t, "ln_f", eps)
    return h @ t["word_embeddings.weight"].T  # lm_head tied to the word embedding


def check_shapes(cfg, t):
    C = cfg.get("hidden_size") or cfg["n_embed"]
    L = cfg.get("n_layer") or cfg["num_hidden_layers"]
    V = cfg["vocab_size"]
    want = {"word_embeddings.weight": (V, C), "word_embeddings_layernorm.weight": (C,),
            "word_embeddings_layernorm.bias": (C,), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        p = f"h.{i}."
        want.update({
            p + "input_layernorm.weight": (C,), p + "input_layernorm.bias": (C,),
            p + "self_attention.query_key_value.weight": (3 * C, C),
            p + "self_attention.query_key_value.bias": (3 * C,),
            p + "self_attention.dense.weight": (C, C), p + "self_attention.dense.bias": (C,),
            p + "post_attention_layernorm.weight": (C,), p + "post_attention_layernorm.bias": (C,),
            p + "mlp.dense_h_to_4h.weight": (4 * C, C), p + "mlp.dense_h_to_4h.bias": (4 * C,),
            p + "mlp.dense_4h_to_h.weight": (C, 4 * C), p + "mlp.dense_4h_to_h.bias": (C,),
        })
    for name, shape in want.items():
        if name not in t:
            raise SystemExit(f"model.safetensors lacks {name}")
        if t[name].shape != shape:
            raise SystemExit(f"{name} has shape {t[name].shape}, config says {shape}")
    extra = sorted(set(t) - set(want))
    if extra:
        raise SystemExit(f"model.safetensors has unexpected tensors: {extra[:5]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--positions", default="-1", help="comma-separated positions (default -1)")
    args = ap.parse_args()
    with open(os.path.join(args.folder, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "bloom":
        raise SystemExit(f"model_type is {cfg.get('model_type')!r}, not bloom")
    t, metadata = read_safetensors(os.path.join(args.folder, "model.safetensors"))
    check_shapes(cfg, t)
    ids = np.array([int(x) for x in args.tokens.split(",")], dtype=np.int64)
    if ids.min() < 0 or ids.max() >= cfg["vocab_size"]:
        raise SystemExit("token id outside the vocabulary")
    logits = forward(cfg, t, ids)
    positions = [int(p) % len(ids) for p in args.positions.split(",")]
    json.dump({"metadata": metadata, "vocab_size": cfg["vocab_size"], "positions": positions,
               "logits": [[float(x) for x in logits[p]] for p in positions]}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
