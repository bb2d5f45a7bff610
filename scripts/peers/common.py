"""What every Python peer of the MiniLM comparison shares (numpy and tokenizers only, so
importing it loads no framework): reading the sentences, tokenising them as
streamfuse's example does, cutting them into length-sorted batches padded to their own
longest, per-call latency percentiles, and the report lines compare-peers.sh reads.

The batching is sentence-transformers' encode(): sort by token length (longest first,
ties in input order), batch neighbours, pad each batch to its longest sentence. It is
the same order as streamfuse's `length_sorted_batches` and candle_bench.rs's.
"""

import argparse
import math
import os
import resource
import time

import numpy as np
from tokenizers import Tokenizer

# sentence-transformers' max_seq_length for all-MiniLM-L6-v2.
MAX_SEQ_LENGTH = 256


def read_sentences(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def tokenizer(model_dir):
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_SEQ_LENGTH)
    return tok


def length_sorted_batches(encoded, batch):
    """Indices of `encoded` (token id lists) in batches of at most `batch` neighbours
    by length, longest first; Python's sort is stable, so ties keep input order."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    return [order[s : s + batch] for s in range(0, len(order), max(batch, 1))]


def pad(encoded, idx):
    """The batch `idx` as int64 arrays (ids, attention mask), padded with 0 to its
    longest sentence."""
    n = max(len(encoded[i]) for i in idx)
    ids = np.zeros((len(idx), n), dtype=np.int64)
    mask = np.zeros((len(idx), n), dtype=np.int64)
    for r, i in enumerate(idx):
        ids[r, : len(encoded[i])] = encoded[i]
        mask[r, : len(encoded[i])] = 1
    return ids, mask


def ort_session(path, threads):
    """An ONNX Runtime session as its users make one for CPU inference: every graph
    optimisation on, `threads` intra-op threads, sequential execution."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def percentile(sorted_values, p):
    """The p-th percentile (nearest rank) of ascending values; 0 when empty."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(p / 100.0 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def cpu_seconds():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def arguments(extra=(), optional=()):
    """The command line every Python peer takes: --model, --sentences, --batch,
    --threads, --out, plus `extra` (names of required options, e.g. "--onnx") and
    `optional` (names of options that may be left out)."""
    ap = argparse.ArgumentParser()
    for name in extra:
        ap.add_argument(name, required=True)
    for name in optional:
        ap.add_argument(name)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sentences", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    return ap.parse_args()


def run(args, forward, header):
    """Tokenises the sentences, runs `forward(ids, mask)` (int64 arrays, one padded
    batch; returns the batch's embeddings as a numpy array) on every length-sorted
    batch, timing each call, and prints the report. The timed part is tokenising and
    embedding."""
    sentences = read_sentences(args.sentences)
    tok = tokenizer(args.model)
    start = time.perf_counter()
    cpu_start = cpu_seconds()
    encoded = [e.ids for e in tok.encode_batch(sentences)]
    out = [None] * len(encoded)
    latencies = []
    for idx in length_sorted_batches(encoded, args.batch):
        t = time.perf_counter()
        ids, mask = pad(encoded, idx)
        emb = forward(ids, mask)
        latencies.append(time.perf_counter() - t)
        for r, i in enumerate(idx):
            out[i] = emb[r]
    secs = time.perf_counter() - start
    report(header, out, len(sentences), secs, cpu_seconds() - cpu_start, latencies, args.out)


def report(header, out, n_sentences, secs, cpu, latencies, out_path=None):
    """Writes the embeddings (little-endian f32 rows, input order) when asked, then
    the lines compare-peers.sh reads: peak RSS, time, cpu, p50_ms, p99_ms,
    sentences/s (last)."""
    if out_path:
        np.stack(out).astype("<f4").tofile(out_path)
    lat = sorted(latencies)
    print(header)
    print(f"embedding 0 begins: {', '.join(f'{v:.7f}' for v in out[0][:5])}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    print(f"time: {secs:.3f} s")
    print(f"cpu: {cpu:.2f} s")
    print(f"calls: {len(lat)}")
    print(f"p50_ms: {percentile(lat, 50) * 1e3:.3f}")
    print(f"p99_ms: {percentile(lat, 99) * 1e3:.3f}")
    print(f"sentences/s: {n_sentences / secs:.1f}")
