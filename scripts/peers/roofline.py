#!/usr/bin/env python3
"""What the machine's matmul can do, and what that allows MiniLM, for compare-peers.sh.

    python roofline.py gemm --lib torch|numpy --threads 1 [2 ...]
    python roofline.py bound --model DIR --sentences FILE --batch 32 --gflops G

`gemm` times f32 matrix products with the library's BLAS (torch: MKL, with the
vendor shim when compare-peers.sh preloads it; numpy: its OpenBLAS, whose threads
are set by OPENBLAS_NUM_THREADS before it loads, so one count a process) and prints
one line per shape and thread count, the best of a few repetitions after a warm-up:

    gemm <lib> <threads> <M>x<K>x<N> <GFLOP/s>

for [1024x1024]x[1024x1024] and MiniLM's feed-forward shape [4096x384]x[384x1536]
(4096 tokens, hidden 384, intermediate 1536).

`bound` counts the corpus's tokens (tokenised as every peer does) and MiniLM's FLOPs:
per token, 2 x (the parameters in the encoder's matrix products: Q, K, V, attention
output, intermediate, output) and per sentence of n tokens, per layer, 4 x n^2 x hidden
for the attention scores and their product with V; the embeddings, layer norms,
softmax, GELU and pooling are left out (a lower count, so a higher bound). Prints the
FLOPs unpadded (every sentence its own length) and padded as batches of --batch
length-sorted neighbours, and the sentences/s bound each gives at --gflops:

    tokens <unpadded> padded <padded>
    gflop unpadded <G> padded <G>
    bound_sps unpadded <S> padded <S>
"""

import argparse
import json
import os
import sys
import time


def gemm(args):
    shapes = [(1024, 1024, 1024), (4096, 384, 1536)]
    if args.lib == "torch":
        import torch

        def make(m, k, n):
            return torch.randn(m, k), torch.randn(k, n)

        def mul(a, b):
            return torch.mm(a, b)

        def set_threads(t):
            torch.set_num_threads(t)

    else:
        import numpy as np

        rng = np.random.default_rng(0)

        def make(m, k, n):
            return (rng.standard_normal((m, k), dtype=np.float32),
                    rng.standard_normal((k, n), dtype=np.float32))

        def mul(a, b):
            return a @ b

        def set_threads(t):
            want = os.environ.get("OPENBLAS_NUM_THREADS")
            if want != str(t):
                sys.exit(f"numpy: set OPENBLAS_NUM_THREADS={t} (it is {want})")

    for t in args.threads:
        set_threads(t)
        for m, k, n in shapes:
            a, b = make(m, k, n)
            mul(a, b)
            reps = max(5, int(4e10 / (2 * m * k * n)))
            best = float("inf")
            for _ in range(reps):
                s = time.perf_counter()
                mul(a, b)
                best = min(best, time.perf_counter() - s)
            print(f"gemm {args.lib} {t} {m}x{k}x{n} {2 * m * k * n / best / 1e9:.1f}", flush=True)


def bound(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    matmul_params = layers * (4 * h * h + 2 * h * inter)
    tok = common.tokenizer(args.model)
    encoded = [e.ids for e in tok.encode_batch(common.read_sentences(args.sentences))]

    def flops(lengths):
        return sum(2 * matmul_params * n + 4 * layers * h * n * n for n in lengths)

    unpadded = [len(e) for e in encoded]
    padded = []
    for idx in common.length_sorted_batches(encoded, args.batch):
        padded += [max(len(encoded[i]) for i in idx)] * len(idx)
    f_un, f_pad = flops(unpadded), flops(padded)
    rate = args.gflops * 1e9
    print(f"sentences {len(encoded)} matmul_params {matmul_params}")
    print(f"tokens {sum(unpadded)} padded {sum(padded)}")
    print(f"gflop unpadded {f_un / 1e9:.2f} padded {f_pad / 1e9:.2f}")
    print(f"bound_sps unpadded {len(encoded) / (f_un / rate):.0f} padded {len(encoded) / (f_pad / rate):.0f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--lib", choices=["torch", "numpy"], required=True)
    g.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    b = sub.add_parser("bound")
    b.add_argument("--model", required=True)
    b.add_argument("--sentences", required=True)
    b.add_argument("--batch", type=int, default=32)
    b.add_argument("--gflops", type=float, required=True)
    args = ap.parse_args()
    gemm(args) if args.cmd == "gemm" else bound(args)


if __name__ == "__main__":
    main()
