#!/usr/bin/env python3
"""OpenVINO peer for the MiniLM comparison: the plain fp32 ONNX export (ort_export.py's
minilm-fp32.onnx, before ONNX Runtime's BERT optimiser, whose com.microsoft operators
OpenVINO does not read), read and compiled by OpenVINO itself, as its users run it.

    python openvino_bench.py --onnx FILE --model DIR --sentences FILE [--batch 32]
        [--threads 2] [--hint throughput|latency] [--out FILE]

`core.compile_model(model, "CPU", {PERFORMANCE_HINT, INFERENCE_NUM_THREADS})` with the
CPU plugin's defaults otherwise (so on a CPU with AMX or AVX512_BF16 it infers in bf16
unless told otherwise; the report names the precision it used). The hint follows the
batch unless --hint says: THROUGHPUT for batches larger than one, run as OpenVINO's
throughput guide does, through an AsyncInferQueue of OPTIMAL_NUMBER_OF_INFER_REQUESTS
requests so that every stream the plugin made has a batch in flight; LATENCY for one
sentence a call, one synchronous infer() at a time. Sentences are tokenised and batched
as every peer does (common.py: sorted by token length, neighbours batched, each batch
padded to its longest); token_type_ids are zeros.

Prints the lines compare-peers.sh reads (common.report) plus `inference_precision: X`
(INFERENCE_PRECISION_HINT of the compiled model), the streams and requests, and
`primitives:`, the runtime model's kernels by layer type (e.g. FullyConnected
brgemm_avx2), which show the instruction set the plugin ran. p50_ms/p99_ms: each
request's own latency (InferRequest.latency: one batch, or one sentence at batch 1).
"""

import collections
import os
import sys
import time

import numpy as np
import openvino as ov

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# Layer types whose kernels say which instruction set ran; the rest are reshapes,
# parameters and constants.
SHOWN = ("FullyConnected", "MatMul", "ScaledDotProductAttention", "MHA", "Subgraph",
         "Eltwise", "MVN", "Softmax", "Gather", "Reduce", "NormalizeL2")


def compiled_model(onnx_path, threads, hint):
    core = ov.Core()
    model = core.read_model(onnx_path)
    return core.compile_model(model, "CPU", {
        "PERFORMANCE_HINT": hint.upper(),
        "INFERENCE_NUM_THREADS": threads,
    })


def feed(ids, mask):
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def precision(compiled):
    p = compiled.get_property("INFERENCE_PRECISION_HINT")
    return p.get_type_name() if hasattr(p, "get_type_name") else str(p)


def primitives(compiled):
    """`Type kernel xN, ...` over the runtime model's layers of the SHOWN types."""
    counts = collections.Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer = str(info["layerType"].astype(str)) if "layerType" in info else op.get_type_name()
        if layer not in SHOWN:
            continue
        kind = str(info["primitiveType"].astype(str)) if "primitiveType" in info else "?"
        counts[(layer, kind)] += 1
    return ", ".join(f"{layer} {kind} x{n}" for (layer, kind), n in sorted(counts.items()))


def main():
    args = common.arguments(extra=["--onnx"], optional=("--hint",))
    hint = args.hint or ("latency" if args.batch == 1 else "throughput")
    compiled = compiled_model(args.onnx, args.threads, hint)
    streams = compiled.get_property("NUM_STREAMS")
    n_requests = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")

    sentences = common.read_sentences(args.sentences)
    tok = common.tokenizer(args.model)
    start = time.perf_counter()
    cpu_start = common.cpu_seconds()
    encoded = [e.ids for e in tok.encode_batch(sentences)]
    out = [None] * len(encoded)
    latencies = []
    batches = common.length_sorted_batches(encoded, args.batch)
    if hint == "throughput":
        queue = ov.AsyncInferQueue(compiled, n_requests)

        def done(request, idx):
            emb = request.get_output_tensor(0).data
            for r, i in enumerate(idx):
                out[i] = emb[r].copy()
            latencies.append(request.latency / 1e3)

        queue.set_callback(done)
        for idx in batches:
            queue.start_async(feed(*common.pad(encoded, idx)), idx)
        queue.wait_all()
    else:
        request = compiled.create_infer_request()
        for idx in batches:
            t = time.perf_counter()
            request.infer(feed(*common.pad(encoded, idx)))
            emb = request.get_output_tensor(0).data
            latencies.append(time.perf_counter() - t)
            for r, i in enumerate(idx):
                out[i] = emb[r].copy()
    secs = time.perf_counter() - start
    cpu = common.cpu_seconds() - cpu_start
    print(f"inference_precision: {precision(compiled)}")
    print(f"primitives: {primitives(compiled)}")
    header = (f"openvino {ov.get_version()} {os.path.basename(args.onnx)}, {hint.upper()} hint, "
              f"INFERENCE_NUM_THREADS {args.threads}, {streams} streams, "
              f"{n_requests if hint == 'throughput' else 1} requests in flight, batch {args.batch}")
    common.report(header, out, len(sentences), secs, cpu, latencies, args.out)


if __name__ == "__main__":
    main()
