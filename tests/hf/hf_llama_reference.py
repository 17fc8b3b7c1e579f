#!/usr/bin/env python3
"""An independent reader of a Hugging Face Llama folder, for testing `keel ckpt export --hf`.

Written from the Hugging Face Llama definition (transformers' modeling_llama.py and
configuration_llama.py: LlamaModel with RMSNorm, rotary embeddings applied with rotate_half,
grouped-query attention through repeat_kv, LlamaMLP down(act(gate(x)) * up(x)), LlamaForCausalLM
with lm_head or the tied embedding), not from keel's code. It reads OUT/config.json and parses
OUT/model.safetensors itself, runs the token sequence through the model in float64 and prints the
logits at the requested positions as JSON:

  hf_llama_reference.py OUT --tokens 1,2,3 [--positions 0,2]   (default: the last position)

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


def rms_norm(x, w, eps):
    # LlamaRMSNorm: x / sqrt(mean(x^2) + eps), times the weight.
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def linear(x, t, prefix, bias):
    # nn.Linear: y = x @ weight.T (+ bias), weight [out, in].
    y = x @ t[prefix + ".weight"].T
    return y + t[prefix + ".bias"] if bias else y


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def scale_inv_freq(inv_freq, scaling):
    # transformers' modeling_rope_utils: "linear" divides every frequency by the factor;
    # "llama3" (_compute_llama3_parameters) leaves short wavelengths, divides long ones by the
    # factor, and interpolates between the two band edges.
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling["factor"]
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        raise SystemExit(f"rope_scaling type {kind!r} is not modelled by this reader")
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(medium, smoothed, scaled)


def rope_cos_sin(cfg, head_dim, T):
    # LlamaRotaryEmbedding: inv_freq = 1 / theta^(arange(0, dim, 2) / dim); emb = cat(freqs, freqs).
    theta = cfg.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if cfg.get("rope_scaling") is not None:
        inv_freq = scale_inv_freq(inv_freq, cfg["rope_scaling"])
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def forward(cfg, t, ids):
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    G = cfg.get("num_key_value_heads") or NH
    hd = cfg.get("head_dim") or C // NH
    eps = cfg.get("rms_norm_eps", 1e-6)
    attn_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    if cfg.get("hidden_act", "silu") != "silu":
        raise SystemExit(f"unsupported hidden_act {cfg.get('hidden_act')!r}")
    T = len(ids)
    if T > cfg["max_position_embeddings"]:
        raise SystemExit(f"{T} tokens exceed max_position_embeddings")
    cos, sin = rope_cos_sin(cfg, hd, T)
    causal = np.tril(np.ones((T, T), dtype=bool))
    h = t["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, t[p + "input_layernorm.weight"], eps)
        q = linear(x, t, p + "self_attn.q_proj", attn_bias).reshape(T, NH, hd).transpose(1, 0, 2)
        k = linear(x, t, p + "self_attn.k_proj", attn_bias).reshape(T, G, hd).transpose(1, 0, 2)
        v = linear(x, t, p + "self_attn.v_proj", attn_bias).reshape(T, G, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: key/value head j serves query heads j * n_rep .. (j + 1) * n_rep - 1.
        n_rep = NH // G
        k, v = np.repeat(k, n_rep, axis=0), np.repeat(v, n_rep, axis=0)
        w = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        w = np.where(causal, w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        o = (w @ v).transpose(1, 0, 2).reshape(T, NH * hd)
        h = h + linear(o, t, p + "self_attn.o_proj", attn_bias)
        x = rms_norm(h, t[p + "post_attention_layernorm.weight"], eps)
        gate = linear(x, t, p + "mlp.gate_proj", mlp_bias)
        up = linear(x, t, p + "mlp.up_proj", mlp_bias)
        h = h + linear(silu(gate) * up, t, p + "mlp.down_proj", mlp_bias)
    h = rms_norm(h, t["model.norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", False)
    head = t["model.embed_tokens.weight"] if tied else t["lm_head.weight"]
    return h @ head.T


def check_shapes(cfg, t):
    C, V, F = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    NH = cfg["num_attention_heads"]
    G = cfg.get("num_key_value_heads") or NH
    hd = cfg.get("head_dim") or C // NH
    attn_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    want = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not cfg.get("tie_word_embeddings", False):
        want["lm_head.weight"] = (V, C)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        want.update({
            p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
            p + "self_attn.q_proj.weight": (NH * hd, C), p + "self_attn.k_proj.weight": (G * hd, C),
            p + "self_attn.v_proj.weight": (G * hd, C), p + "self_attn.o_proj.weight": (C, NH * hd),
            p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
            p + "mlp.down_proj.weight": (C, F),
        })
        if attn_bias:
            want.update({p + "self_attn.q_proj.bias": (NH * hd,),
                         p + "self_attn.k_proj.bias": (G * hd,),
                         p + "self_attn.v_proj.bias": (G * hd,), p + "self_attn.o_proj.bias": (C,)})
        if mlp_bias:
            want.update({p + "mlp.gate_proj.bias": (F,), p + "mlp.up_proj.bias": (F,),
                         p + "mlp.down_proj.bias": (C,)})
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
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"model_type is {cfg.get('model_type')!r}, not llama")
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
