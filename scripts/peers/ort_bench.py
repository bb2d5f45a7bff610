#!/usr/bin/env python3
"""ONNX Runtime peer for the MiniLM comparison: one of ort_export.py's models (the
optimised fp32 one or its dynamically quantised int8 variant), whose graph returns the
pooled, normalised embedding.

    python ort_bench.py --onnx FILE --model DIR --sentences FILE [--batch 32]
        [--threads 2] [--out FILE]

One InferenceSession on the CPU execution provider: intra_op_num_threads = --threads,
inter_op_num_threads 1, sequential execution, graph_optimization_level
ORT_ENABLE_ALL; one run() at a time. Sentences are tokenised and batched as every peer
does (common.py: sorted by token length, neighbours batched, each batch padded to its
longest); token_type_ids are zeros.

Prints `peak RSS: X MiB`, `p50_ms:`/`p99_ms:` (latency of one run() call with its
padding; per sentence with --batch 1) and `sentences/s: X`; --out writes the
embeddings as little-endian f32 rows in input order. Imports no torch.
"""

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sentences", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(args.onnx, so, providers=["CPUExecutionProvider"])
    sentences = common.read_sentences(args.sentences)
    tok = common.tokenizer(args.model)

    start = time.perf_counter()
    cpu_start = common.cpu_seconds()
    encoded = [e.ids for e in tok.encode_batch(sentences)]
    out = [None] * len(encoded)
    latencies = []
    for idx in common.length_sorted_batches(encoded, args.batch):
        t = time.perf_counter()
        ids, mask = common.pad(encoded, idx)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        emb = session.run(["embedding"], feed)[0]
        latencies.append(time.perf_counter() - t)
        for r, i in enumerate(idx):
            out[i] = emb[r]
    secs = time.perf_counter() - start
    cpu = common.cpu_seconds() - cpu_start

    common.report(
        f"onnxruntime {ort.__version__} {os.path.basename(args.onnx)}, "
        f"{args.threads} intra-op threads, batch {args.batch}",
        out, len(sentences), secs, cpu, latencies, args.out,
    )


if __name__ == "__main__":
    main()
