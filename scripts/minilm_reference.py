#!/usr/bin/env python3
"""Independent reference embeddings for all-MiniLM-L6-v2, in numpy (float64).

Reads model.safetensors itself (the header is parsed by hand: 8-byte little-endian
length, JSON, raw little-endian data), takes token ids from the `tokenizers`
package, and runs the BERT forward pass of sentence-transformers one sentence at a
time (no padding): embeddings, 6 post-norm layers with exact (erf) GELU, mean
pooling, L2 normalisation. Nothing here comes from streamfuse.

    PY=$(scripts/setup-python.sh)
    $PY scripts/minilm_reference.py --model target/models/all-MiniLM-L6-v2 \
        --out tests/data/minilm_reference.tsv

Output: comment lines starting with '#', then one line per sentence:
`sentence<TAB>v0 v1 ... v383` (the embedding, 9 significant digits).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
from tokenizers import Tokenizer

SENTENCES = [
    "This is an example sentence",
    "Each sentence is converted",
    "The cat sits outside",
    "A man is playing guitar",
    "I love pasta",
    "The new movie is awesome",
    "The cat plays in the garden",
    "A woman watches TV",
    "The new movie is so great",
    "Do you like pizza?",
    "Hi",
    "Streamfuse runs tensor programs lazily on the CPU, fusing element-wise chains into few kernels.",
    "Héllo wörld — naïve café, résumé; 東京 and Zürich!",
    "The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly, "
    "and a sphinx of black quartz judges my vow near the old stone bridge by the river.",
    "Numbers like 3.14159, 2,718 and 1e-12 are tokenised too.",
    "What is the capital of France? Paris is the capital and most populous city of France.",
    "UPPER CASE and lower case become the same tokens in an uncased model",
    "Semantic search finds documents whose embeddings are close to the query's embedding.",
    "   leading and trailing spaces   ",
    "A sentence with a very long word: pneumonoultramicroscopicsilicovolcanoconiosis.",
    "Machine learning models turn text into vectors of numbers.",
    "Rust guarantees memory safety without a garbage collector.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness.",
    "ok",
]

MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for this model


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = {"F32": "<f4", "I64": "<i8", "F16": "<f2"}[info["dtype"]]
        arr = np.frombuffer(data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                            offset=base + start)
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def embed(ids, W, cfg):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    dh = h // heads
    eps = cfg["layer_norm_eps"]
    n = len(ids)
    x = (W["embeddings.word_embeddings.weight"][ids]
         + W["embeddings.position_embeddings.weight"][:n]
         + W["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    for l in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{l}."
        lin = lambda t, name: t @ W[p + name + ".weight"].T + W[p + name + ".bias"]
        q = lin(x, "attention.self.query").reshape(n, heads, dh).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, heads, dh).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, heads, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        s = s - s.max(-1, keepdims=True)
        e = np.exp(s)
        a = e / e.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(n, h)
        x = layer_norm(lin(ctx, "attention.output.dense") + x,
                       W[p + "attention.output.LayerNorm.weight"],
                       W[p + "attention.output.LayerNorm.bias"], eps)
        f = lin(gelu(lin(x, "intermediate.dense")), "output.dense")
        x = layer_norm(f + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], eps)
    m = x.mean(0)
    return m / max(np.linalg.norm(m), 1e-12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="target/models/all-MiniLM-L6-v2")
    ap.add_argument("--out", default="tests/data/minilm_reference.tsv")
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("hidden_act", "gelu") != "gelu":
        sys.exit("this reference implements hidden_act=gelu only")
    W = load_safetensors(os.path.join(args.model, "model.safetensors"))
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_SEQ_LENGTH)

    rows = []
    for s in SENTENCES:
        assert "\t" not in s and "\n" not in s
        ids = tok.encode(s).ids
        e = embed(np.array(ids), W, cfg)
        rows.append((s, e))
        print(f"{len(ids):4d} tokens  {e[:5].round(7)}  {s[:60]}", file=sys.stderr)

    with open(args.out, "w", encoding="utf-8") as f:
        f.write("# all-MiniLM-L6-v2 reference embeddings: scripts/minilm_reference.py (numpy, float64)\n")
        f.write("# format: sentence<TAB>384 space-separated floats (mean-pooled, L2-normalised)\n")
        for s, e in rows:
            f.write(s + "\t" + " ".join(f"{v:.9g}" for v in e) + "\n")
    print(f"wrote {len(rows)} embeddings to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
