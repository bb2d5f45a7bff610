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

import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    args = common.arguments(extra=["--onnx"])
    session = common.ort_session(args.onnx, args.threads)

    def forward(ids, mask):
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return session.run(["embedding"], feed)[0]

    common.run(
        args,
        forward,
        f"onnxruntime {ort.__version__} {os.path.basename(args.onnx)}, "
        f"{args.threads} intra-op threads, batch {args.batch}",
    )


if __name__ == "__main__":
    main()
