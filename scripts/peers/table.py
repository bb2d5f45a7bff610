#!/usr/bin/env python3
"""The table compare-peers.sh prints at the end of a run, from the files the run wrote:
rows.tsv (section, role, name, index), results.tsv (one line per run of a row), each
row's embeddings (rowI.bin, from its last run), gemm.txt and bound.txt (roofline.py)
and the ONNX optimiser's report. Medians are over a row's successful runs."""

import argparse
import statistics

import numpy as np

DIM = 384


def read_tsv(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def min_cos(a_path, b_path):
    try:
        a = np.fromfile(a_path, "<f4").reshape(-1, DIM)
        b = np.fromfile(b_path, "<f4").reshape(-1, DIM)
    except (OSError, ValueError):
        return None
    if a.shape != b.shape or not len(a):
        return None
    c = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(c.min())


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser()
    for a in ("rows", "results", "out", "gemm", "bound", "optimizer", "sentences", "load", "cpu"):
        ap.add_argument("--" + a, required=True)
    for a in ("repeat", "threads", "batch"):
        ap.add_argument("--" + a, type=int, required=True)
    args = ap.parse_args()

    rows = read_tsv(args.rows)  # section, role, name, index
    runs = {}
    for section, i, _run, status, sps, cpu, rss, p50, p99 in read_tsv(args.results):
        runs.setdefault(i, []).append((status, num(sps), num(cpu), num(rss), num(p50), num(p99)))
    bound = {}
    with open(args.bound) as f:
        for line in f:
            k, *v = line.split()
            bound[k] = v
    gemm = [line.split() for line in open(args.gemm) if line.startswith("gemm ")]
    n_sentences = int(bound["sentences"][0])
    tokens, padded_tokens = int(bound["tokens"][0]), int(bound["tokens"][2])
    gflop_unpadded, gflop_padded = float(bound["gflop"][1]), float(bound["gflop"][3])
    best = max((float(g[4]) for g in gemm if int(g[2]) == args.threads), default=0.0)
    bound_sps = n_sentences / (gflop_unpadded / best) if best else None
    bound_padded = n_sentences / (gflop_padded / best) if best else None

    print()
    print("=" * 100)
    print(f"all-MiniLM-L6-v2, {n_sentences} sentences ({tokens} tokens), {args.threads} threads per "
          f"peer, median of {args.repeat} run{'s' if args.repeat != 1 else ''} per row")
    print(f"machine: {args.cpu}; load average (1/5/15 min) at start / at end: {args.load}")

    print()
    measured = sum(1 for g in gemm if g[1] == "torch" and g[3] == "1024x1024x1024" and g[2] == "1")
    print(f"matmul f32 GFLOP/s, measured in this run, the best of {measured} measurement"
          f"{'s' if measured != 1 else ''} (one before each repetition of the rows):")
    threads = sorted({int(g[2]) for g in gemm})
    libs = {"torch": "torch (MKL" + (", Intel shim)" if "not GenuineIntel" in args.cpu else ")"),
            "numpy": "numpy (OpenBLAS)"}
    shapes = {"1024x1024x1024": "[1024x1024]x[1024x1024]", "4096x384x1536": "[4096x384]x[384x1536]"}
    print(f"  {'library':<24} {'shape':<26}" + "".join(f" {f'{t} thread' + ('s' if t > 1 else ''):>10}" for t in threads))
    for lib in ("torch", "numpy"):
        for shape, label in shapes.items():
            vals = {}
            for g in gemm:
                if g[1] == lib and g[3] == shape:
                    vals[int(g[2])] = max(vals.get(int(g[2]), 0.0), float(g[4]))
            if vals:
                print(f"  {libs[lib]:<24} {label:<26}" + "".join(f" {fmt(vals.get(t), '.1f'):>10}" for t in threads))
    each = [g[4] for g in gemm if g[1] == "torch" and g[3] == "4096x384x1536" and int(g[2]) == args.threads]
    if len(each) > 1:
        print(f"  (torch [4096x384]x[384x1536], {args.threads} threads, measurement by measurement: "
              f"{', '.join(each)}; a spread means other work shared the cores then)")
    print(f"unpadded FLOP bound: {gflop_unpadded:.1f} GFLOP for the corpus ({tokens} tokens x 2 x "
          f"{int(bound['sentences'][2]):,} matmul parameters, plus "
          f"attention's 4 x layers x hidden x n^2 per sentence); at {best:.1f} GFLOP/s (the best "
          f"{args.threads}-thread rate above): {fmt(bound_sps, '.0f')} sentences/s at most")
    print(f"  (batch {args.batch} padded to each batch's longest: {padded_tokens} tokens, "
          f"{gflop_padded:.1f} GFLOP, {fmt(bound_padded, '.0f')} sentences/s; batch 1 is unpadded)")

    sections = []
    for r in rows:
        if r[0] not in sections:
            sections.append(r[0])
    for section in sections:
        srows = [r for r in rows if r[0] == section]
        ref = next((r for r in srows if r[1] == "sf-ref"), None)
        ref_path = f"{args.out}/row{ref[3]}.bin" if ref else None
        stats = {}
        for _s, role, name, i in srows:
            ok = [x for x in runs.get(i, []) if x[0] == "ok" and x[1] is not None]
            med = lambda k: statistics.median([x[k] for x in ok if x[k] is not None]) if ok else None
            rss = max((x[3] for x in ok if x[3] is not None), default=None)
            stats[i] = dict(sps=med(1), cpu=med(2), rss=rss, p50=med(4), p99=med(5),
                            n=len(ok), tries=len(runs.get(i, [])))
        torch_best = max((stats[r[3]]["sps"] or 0 for r in srows if r[1] == "torch"), default=0)
        b = int(section)
        print()
        if b == 1:
            print("batch 1: one sentence per call, one call at a time (per stream); p50/p99: "
                  "latency of one call = one sentence")
        else:
            print(f"batch {b}: length-sorted batches of {b}, each padded to its longest "
                  f"({100 * (padded_tokens - tokens) / padded_tokens:.1f}% padding) by the peers, "
                  f"run ragged (no padding) by streamfuse; p50/p99: latency of one call = one batch")
        head = (f"{'peer':<36} {'sentences/s':>11} {'vs pytorch':>10} {'of bound':>8} {'p50 ms':>8} "
                f"{'p99 ms':>8} {'peak RSS MiB':>12} {'CPU s':>6} {'sent/CPU-s':>10} {'min cos vs sf':>13}")
        print(head)
        print("-" * len(head))
        for _s, role, name, i in srows:
            st = stats[i]
            if st["sps"] is None:
                print(f"{name:<36} {'failed':>11}")
                continue
            ratio = f"{st['sps'] / torch_best:.2f}x" if torch_best else "-"
            of_bound = f"{100 * st['sps'] / bound_sps:.0f}%" if bound_sps else "-"
            per_cpu = n_sentences / st["cpu"] if st["cpu"] else None
            cos = min_cos(f"{args.out}/row{i}.bin", ref_path) if ref_path else None
            runs_note = "" if st["n"] == st["tries"] else f" ({st['n']}/{st['tries']} runs ok)"
            print(f"{name:<36} {st['sps']:>11.1f} {ratio:>10} {of_bound:>8} {fmt(st['p50'], '.2f'):>8} "
                  f"{fmt(st['p99'], '.2f'):>8} {fmt(st['rss'], '.0f'):>12} {fmt(st['cpu'], '.2f'):>6} "
                  f"{fmt(per_cpu, '.0f'):>10} {fmt(cos, '.6f'):>13}{runs_note}")
        # streamfuse's reduced precisions against its own f32 (the same threads) and
        # against ONNX Runtime's int8 (the faster of its two rows).
        sf32 = ref if b == 1 else (next((r for r in srows if r[1] == "sf"), None) or ref)
        ort8 = max((r for r in srows if r[1] == "ort-int8"), key=lambda r: stats[r[3]]["sps"] or 0,
                   default=None)
        for _s, role, name, i in srows:
            if role.startswith("sf-") and role != "sf-ref" and stats[i]["sps"]:
                against = [(sf32, "streamfuse f32"), (ort8, None)]
                parts = []
                for r, label in against:
                    if r and stats[r[3]]["sps"]:
                        parts.append(f"{stats[i]['sps'] / stats[r[3]]['sps']:.2f}x {label or r[2]}")
                print(f"  {name}: " + ", ".join(parts))
        # Issue 12's targets, read off this section: at batch B, streamfuse's f32-accurate
        # rows (f32 and bf16x3) against the best fp32 peer's sentences/s; at batch 1,
        # their p50 against ONNX Runtime fp32's.
        fp32 = next((r for r in srows if r[1] == "ort-fp32"), None)
        peers32 = [r for r in srows if r[1] in ("torch", "ort-fp32") and stats[r[3]]["sps"]]
        best32 = max(peers32, key=lambda r: stats[r[3]]["sps"], default=None)
        for _s, role, name, i in srows:
            if role not in ("sf-ref", "sf", "sf-bf16x3") or not stats[i]["sps"]:
                continue
            if b == 1 and fp32 and stats[fp32[3]]["p50"] and stats[i]["p50"]:
                print(f"  {name}: p50 {stats[i]['p50'] / stats[fp32[3]]['p50']:.2f}x {fp32[2]}'s")
            elif b != 1 and best32:
                print(f"  {name}: {stats[i]['sps'] / stats[best32[3]]['sps']:.2f}x the best fp32 peer "
                      f"({best32[2]})")
        if fp32:
            for _s, role, name, i in srows:
                if role == "ort-int8":
                    c = min_cos(f"{args.out}/row{i}.bin", f"{args.out}/row{fp32[3]}.bin")
                    print(f"  {name}: min cos to onnxruntime fp32's embeddings {fmt(c, '.6f')}")

    print()
    print(f"(Medians of {args.repeat} run{'s' if args.repeat != 1 else ''}: sentences/s, p50, p99 and CPU s; peak RSS is the largest "
          "of the runs, /usr/bin/time's maximum resident set. sentences/s and CPU s cover the timed "
          "part: tokenising and embedding, after loading. 'vs pytorch' divides by the faster PyTorch "
          "row of the section; 'of bound' by the unpadded FLOP bound, an f32 bound that the int8 rows, "
          "whose matrix products are 8-bit integer ones, are not held to. CPU s is user + system time of "
          "all threads: ONNX Runtime's and torch's idle workers spin, which it counts. min cos vs sf: "
          "each row's embeddings against streamfuse --threads 1's of the same section.)")
    print()
    print("ONNX Runtime models (scripts/peers/ort_export.py):")
    with open(args.optimizer) as f:
        for line in f:
            print("  " + line.rstrip())


if __name__ == "__main__":
    main()
