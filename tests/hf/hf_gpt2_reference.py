#!/usr/bin/env python3
"""An independent reader of a Hugging Face GPT-2 folder, for testing `keel ckpt export --hf`.

Written from the Hugging Face GPT-2 definition (transformers' modeling_gpt2.py: GPT2Model,
GPT2Attention, GPT2MLP with Conv1D layers, GPT2LMHeadModel with the head tied to wte), not from
keel's code. It reads OUT/config.json and parses OUT/model.safetensors itself (8-byte little-endian
header length, JSON header, raw little-endian tensors), runs the token sequence through the model
in float64 and prints the logits at the requested positions as JSON:

  hf_gpt2_reference.py OUT --tokens 1,2,3 [--positions 0,2]   (default: the last position)

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


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def activation(name):
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        c = math.sqrt(2.0 / math.pi)
        return lambda x: 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))
    if name == "gelu":
        erf = np.vectorize(math.erf)
        return lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "relu":
        return lambda x: np.maximum(x, 0.0)
    raise SystemExit(f"unsupported activation_function {name!r}")


def conv1d(x, t, prefix):
    # HF Conv1D: y = x @ weight + bias with weight [in, out].
    return x @ t[prefix + ".weight"] + t[prefix + ".bias"]


def forward(cfg, t, ids):
    n_embd, n_head = cfg["n_embd"], cfg["n_head"]
    head_dim = n_embd // n_head
    eps = cfg["layer_norm_epsilon"]
    act = activation(cfg["activation_function"])
    T = len(ids)
    if T > cfg["n_positions"]:
        raise SystemExit(f"{T} tokens exceed n_positions {cfg['n_positions']}")
    h = t["wte.weight"][ids] + t["wpe.weight"][np.arange(T)]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(h, t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
        qkv = conv1d(a, t, p + "attn.c_attn")  # (T, 3C): split along the last dim into q, k, v
        q, k, v = np.split(qkv, 3, axis=-1)
        # _split_heads: (T, C) -> (heads, T, head_dim)
        q, k, v = (x.reshape(T, n_head, head_dim).transpose(1, 0, 2) for x in (q, k, v))
        w = q @ k.transpose(0, 2, 1)
        if cfg.get("scale_attn_weights", True):
            w = w / math.sqrt(head_dim)
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            w = w / float(i + 1)
        w = np.where(causal, w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        o = (w @ v).transpose(1, 0, 2).reshape(T, n_embd)  # _merge_heads
        h = h + conv1d(o, t, p + "attn.c_proj")
        m = layer_norm(h, t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
        h = h + conv1d(act(conv1d(m, t, p + "mlp.c_fc")), t, p + "mlp.c_proj")
    h = layer_norm(h, t["ln_f.weight"], t["ln_f.bias"], eps)
    head = t["lm_head.weight"] if "lm_head.weight" in t else t["wte.weight"]  # tied
    return h @ head.T


def check_shapes(cfg, t):
    C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    F = cfg.get("n_inner") or 4 * C
    want = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        want.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, F), p + "mlp.c_fc.bias": (F,),
            p + "mlp.c_proj.weight": (F, C), p + "mlp.c_proj.bias": (C,),
        })
    for name, shape in want.items():
        if name not in t:
            raise SystemExit(f"model.safetensors lacks {name}")
        if t[name].shape != shape:
            raise SystemExit(f"{name} has shape {t[name].shape}, config says {shape}")
    extra = sorted(set(t) - set(want) - {"lm_head.weight"})
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
    if cfg.get("model_type") != "gpt2":
        raise SystemExit(f"model_type is {cfg.get('model_type')!r}, not gpt2")
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
