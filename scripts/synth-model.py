#!/usr/bin/env python3
"""Writes a GGUF of a real model's shape and architecture with random weights, for measuring
speed, memory and load time at sizes no package registry ships (issue: speed at the sizes
people run). The tokenizer, template and special tokens are copied from a real GGUF (default:
the packaged SmolLM2 for the SmolLM2/Llama shapes; llama.cpp's own `qwen2` and `llama-bpe`
vocab files, as the tokenizer tests fetch them, for the Qwen2.5 and Llama 3.2 shapes), so
`generate`, `serve` and llama.cpp's tools take the file as they take a real one. Other types
come from llama.cpp's quantizer:

    python3 scripts/synth-model.py --shape 1.7b --type f16 --out /tmp/s17.f16.gguf
    llama-quantize /tmp/s17.f16.gguf /tmp/s17.Q4_K_M.gguf Q4_K_M

Needs `pip install gguf==0.19.0 numpy`. Tensors are written one at a time (memory: one tensor).
"""

import argparse
import os

import numpy as np
import gguf

# name: (layers, embedding, feed-forward, heads, KV heads, tied output)
SHAPES = {
    # SmolLM2-1.7B
    "1.7b": (24, 2048, 8192, 32, 32, True),
    # Llama-3.1-8B (with the copied tokenizer's vocabulary)
    "8b": (32, 4096, 14336, 32, 8, False),
    # Qwen2.5-1.5B: architecture qwen2 (Q/K/V biases), its 151,936-token vocabulary
    "qwen2.5-1.5b": (28, 1536, 8960, 12, 2, True),
    # Qwen2.5-0.5B
    "qwen2.5-0.5b": (24, 896, 4864, 14, 2, True),
    # Llama-3.2-1B: Llama 3.1+ rotary factors (`rope_freqs`), its 128,256-token vocabulary
    "llama3.2-1b": (16, 2048, 8192, 32, 8, True),
    # small, for trying the script
    "tiny": (2, 256, 512, 4, 2, True),
}
# name: (architecture, rope base, rms epsilon, context, llama.cpp vocab file or None for SmolLM2)
FAMILY = {
    "qwen2.5-1.5b": ("qwen2", 1_000_000.0, 1e-6, 32768, "ggml-vocab-qwen2.gguf"),
    "qwen2.5-0.5b": ("qwen2", 1_000_000.0, 1e-6, 32768, "ggml-vocab-qwen2.gguf"),
    "llama3.2-1b": ("llama", 500_000.0, 1e-5, 131072, "ggml-vocab-llama-bpe.gguf"),
}
DEFAULT_FAMILY = ("llama", 10000.0, 1e-5, 8192, None)
TYPES = {
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
]


def default_source(vocab_file=None):
    cache = os.environ.get("PAGEWARDEN_CACHE", os.path.expanduser("~/.cache/pagewarden"))
    if vocab_file:
        # Where the tokenizer tests extract them (`cargo test -p text --test llama_cpp_vocabs`).
        return os.path.join(cache, "llama-cpp-python-0.3.36", vocab_file)
    return os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")


def llama3_factors(head_dim, base, factor=32.0, low=1.0, high=4.0, original=8192):
    """Llama 3.2's `rope_freqs`: the divisor of each rotary pair's angle."""
    out = []
    for i in range(head_dim // 2):
        freq = 1.0 / base ** (2 * i / head_dim)
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def copy_tokenizer(src, w):
    r = gguf.GGUFReader(src)
    n_vocab = 0
    for key in TOKENIZER_KEYS:
        f = r.fields.get(key)
        if f is None:
            continue
        v = f.contents()
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(key, v)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(v)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(key, v)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(key, v)
        else:
            w.add_uint32(key, int(v))
    return n_vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--type", choices=TYPES, default="f16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    layers, embd, ff, heads, kv_heads, tied = SHAPES[a.shape]
    arch, rope_base, eps, context, vocab_file = FAMILY.get(a.shape, DEFAULT_FAMILY)
    qtype = TYPES[a.type]
    head_dim = embd // heads
    kv_dim = kv_heads * head_dim
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"synthetic-{a.shape}")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    vocab = copy_tokenizer(a.tokenizer_from or default_source(vocab_file), w)
    if arch == "llama":
        w.add_vocab_size(vocab)

    # (name, rows, cols): matrices are quantized, vectors stay f32 (as llama.cpp keeps norms
    # and biases); rows "bias" marks a bias vector, "rope" Llama 3's rotary factors.
    tensors = [("token_embd.weight", vocab, embd)]
    if a.shape == "llama3.2-1b":
        tensors.append(("rope_freqs.weight", "rope", head_dim // 2))
    for i in range(layers):
        if arch == "qwen2":
            tensors += [
                (f"blk.{i}.attn_q.bias", "bias", embd),
                (f"blk.{i}.attn_k.bias", "bias", kv_dim),
                (f"blk.{i}.attn_v.bias", "bias", kv_dim),
            ]
        tensors += [
            (f"blk.{i}.attn_norm.weight", None, embd),
            (f"blk.{i}.attn_q.weight", embd, embd),
            (f"blk.{i}.attn_k.weight", kv_dim, embd),
            (f"blk.{i}.attn_v.weight", kv_dim, embd),
            (f"blk.{i}.attn_output.weight", embd, embd),
            (f"blk.{i}.ffn_norm.weight", None, embd),
            (f"blk.{i}.ffn_gate.weight", ff, embd),
            (f"blk.{i}.ffn_up.weight", ff, embd),
            (f"blk.{i}.ffn_down.weight", embd, ff),
        ]
    tensors.append(("output_norm.weight", None, embd))
    if not tied:
        tensors.append(("output.weight", vocab, embd))

    rng = np.random.default_rng(a.seed)

    def make(rows, cols):
        if rows == "rope":
            return llama3_factors(head_dim, rope_base)
        if rows == "bias":
            return (0.1 * rng.standard_normal(cols, dtype=np.float32)).astype(np.float32)
        if rows is None:
            return (1.0 + 0.1 * rng.standard_normal(cols, dtype=np.float32)).astype(np.float32)
        x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(1.0 / np.sqrt(cols))
        if qtype == gguf.GGMLQuantizationType.F16:
            return x.astype(np.float16)
        return gguf.quants.quantize(x, qtype)

    def info(name, rows, cols):
        if rows is None or isinstance(rows, str):
            return [cols], np.float32, 4 * cols, None
        if qtype == gguf.GGMLQuantizationType.F16:
            return [rows, cols], np.float16, 2 * rows * cols, None
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return [rows, cols // block * size], np.uint8, rows * cols // block * size, qtype

    for name, rows, cols in tensors:
        shape, dtype, nbytes, raw = info(name, rows, cols)
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    w.add_file_type({"f16": 1, "q8_0": 7, "q4_0": 2}[a.type])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols in tensors:
        w.write_tensor_data(make(rows, cols))
    w.close()


if __name__ == "__main__":
    main()
