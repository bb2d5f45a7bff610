#!/usr/bin/env python3
"""ONNX Runtime under loadgen's load, in process: one InferenceSession shared by C
client threads, each sending N requests of 1..K texts, one at a time.

    python ort_serve.py --onnx FILE --model DIR --sentences FILE --clients 16
        --requests 40 --max-texts 8 [--seed 1] [--threads 2] [--linger SECS]

The requests are exactly examples/loadgen.rs's: client c draws the size of each
request and its sentences from SplitMix64 seeded with seed + c, in the same order.
Each request is tokenised as every peer does (common.py: truncation at 256 tokens, no
padding), padded to its own longest text and run as one session.run() of the model's
pooled, normalised output (ort_export.py's graph). The session: CPU provider,
intra_op_num_threads = --threads, inter_op_num_threads 1, ORT_ENABLE_ALL, sequential
execution; run() releases the GIL, so the C threads' calls overlap in ONNX Runtime.

Prints `texts/s: X requests: R p50_ms: A p90_ms: B p99_ms: C` (latency of a request,
tokenising included, as loadgen measures it), `peak RSS: X MiB` and, with --linger,
`rss_after_idle_mib:` after that many idle seconds. Imports no torch.
"""

import argparse
import os
import resource
import sys
import threading
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MASK64 = (1 << 64) - 1


class SplitMix64:
    """examples/loadgen.rs's generator, bit for bit."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def below(self, n):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return (z ^ (z >> 31)) % n


def requests(sentences, client, args):
    rng = SplitMix64(args.seed + client)
    out = []
    for _ in range(args.requests):
        n = 1 + rng.below(args.max_texts)
        out.append([sentences[rng.below(len(sentences))] for _ in range(n)])
    return out


def rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sentences", required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-texts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--linger", type=int, default=0)
    args = ap.parse_args()

    sentences = [s for s in common.read_sentences(args.sentences) if s.strip()]
    work = [requests(sentences, c, args) for c in range(args.clients)]
    texts = sum(len(r) for w in work for r in w)
    tok = common.tokenizer(args.model)
    session = common.ort_session(args.onnx, args.threads)
    print(
        f"onnxruntime {ort.__version__} {os.path.basename(args.onnx)}, one session, "
        f"{args.threads} intra-op threads, {args.clients} client threads",
        file=sys.stderr,
    )

    latencies = [[] for _ in work]
    errors = []
    start_line = threading.Barrier(args.clients + 1)

    def client(c):
        start_line.wait()
        try:
            for req in work[c]:
                t = time.perf_counter()
                encoded = [e.ids for e in tok.encode_batch(req)]
                ids, mask = common.pad(encoded, range(len(encoded)))
                feed = {
                    "input_ids": ids,
                    "attention_mask": mask,
                    "token_type_ids": np.zeros_like(ids),
                }
                emb = session.run(["embedding"], feed)[0]
                if emb.shape[0] != len(req):
                    raise RuntimeError(f"{emb.shape[0]} embeddings for {len(req)} texts")
                latencies[c].append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001 - reported, then the run fails
            errors.append(f"client {c}: {e}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    start_line.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    if args.linger:
        time.sleep(args.linger)
        print(f"rss_after_idle_mib: {rss_mib('VmRSS:'):.1f} (after {args.linger} s idle)")
    lat = sorted(x for c in latencies for x in c)
    for e in errors:
        print(f"client error: {e}", file=sys.stderr)
    print(
        f"texts/s: {texts / secs:.1f} requests: {len(lat)} "
        f"p50_ms: {common.percentile(lat, 50) * 1e3:.2f} "
        f"p90_ms: {common.percentile(lat, 90) * 1e3:.2f} "
        f"p99_ms: {common.percentile(lat, 99) * 1e3:.2f}"
    )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
