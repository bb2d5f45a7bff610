#!/usr/bin/env python3
"""The table compare-peers.sh prints at the end of a run, from the files the run wrote:
rows.tsv (section, role, name, index, isa), results.tsv (one line per run of a row),
each row's embeddings (rowI.bin, from its last run), gemm.txt and bound.txt
(roofline.py), the ONNX optimiser's report and, with --caps, the statement of which
rows ran at which instruction set (printed under the tables). Medians are over a row's
successful runs.

Under each section's table it reads off the targets of issues 12 and 29: streamfuse's
f32-accurate rows against the best fp32 peer (batch B) or ONNX Runtime fp32's p50
(batch 1), its int8 rows against ONNX Runtime int8's sentences/s, its bf16 and int8
rows against its own f32, with their smallest cosine to its f32 embeddings. When
compare-peers.sh --isa capped the peers, "the best fp32 peer" is the best capped one,
and every f32 ratio is also given against ONNX Runtime fp32, which no cap reaches."""

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


def print_targets(b, srows, stats, precision, out):
    """Issue 12's and 29's targets read off one section (batch `b`): each of
    streamfuse's rows against the peer its target names, with the target and whether
    this run met it, and the smallest cosine of the reduced precisions to streamfuse's
    f32 (--threads 1) embeddings of the section."""

    def first(role):
        return next((r for r in srows if r[1] == role and stats[r[3]]["sps"]), None)

    def st(r, k):
        return stats[r[3]][k] if r else None

    def ratio(x, y):
        return x / y if x and y else None

    def target(value, bound, at_least=True):
        if value is None:
            return ""
        met = value >= bound if at_least else value <= bound
        return f" [target {'>=' if at_least else '<='} {bound:g}x: {'met' if met else 'missed'}]"

    def cos(r, ref, bound):
        c = min_cos(f"{out}/row{r[3]}.bin", f"{out}/row{ref[3]}.bin") if r and ref else None
        if c is None:
            return "min cos to our f32 -"
        return f"min cos to our f32 {c:.6f} [target >= {bound:g}: {'met' if c >= bound else 'missed'}]"

    ref = first("sf-ref")
    sf32 = ref if b == 1 else (first("sf") or ref)
    capped = any(r[4].startswith("cap") for r in srows)
    # fp32 peers: PyTorch, ONNX Runtime fp32, and OpenVINO when it inferred in f32. When
    # the peers were capped, only the (wholly) capped ones compete for "the best"; the
    # others (uncapped, or capped in part) are upper references, each given its ratio.
    fp32_all = [r for r in srows
                if stats[r[3]]["sps"]
                and (r[1] in ("torch", "ort-fp32") or (r[1] == "ov" and precision.get(r[3]) == "f32"))]
    fp32 = [r for r in fp32_all if not capped or r[4].startswith("cap")]
    refs = [r for r in fp32_all if r not in fp32]
    best = max(fp32, key=lambda r: st(r, "sps"), default=None)
    best_p50 = min((r for r in fp32 if st(r, "p50")), key=lambda r: st(r, "p50"), default=None)
    ort32 = first("ort-fp32")
    ort8 = max((r for r in srows if r[1] == "ort-int8" and stats[r[3]]["sps"]),
               key=lambda r: st(r, "sps"), default=None)
    isa = lambda r: f", {r[4]}" if r[4] != "native" else ""

    print("  targets (issues 12 and 29), this section"
          + (" (p50 ratios: lower is faster):" if b == 1 else " (sentences/s ratios: higher is faster):"))
    for r in srows:
        role, name = r[1], r[2]
        if not role.startswith("sf") or not st(r, "sps"):
            continue
        parts = []
        if role in ("sf-ref", "sf", "sf-bf16x3"):
            if b == 1:
                v = ratio(st(r, "p50"), st(ort32, "p50"))
                if v is not None:
                    parts.append(f"p50 {v:.2f}x that of {ort32[2]}{isa(ort32)}"
                                 + (target(v, 0.75, at_least=False) if r is ref else ""))
                if capped and best_p50:
                    parts.append(f"p50 {fmt(ratio(st(r, 'p50'), st(best_p50, 'p50')), '.2f')}x that of the fastest "
                                 f"capped fp32 peer ({best_p50[2]}{isa(best_p50)})")
                for o in refs:
                    if o is not ort32:
                        parts.append(f"p50 {fmt(ratio(st(r, 'p50'), st(o, 'p50')), '.2f')}x that of {o[2]}{isa(o)}")
            else:
                v = ratio(st(r, "sps"), st(best, "sps"))
                if v is not None:
                    parts.append(f"{v:.2f}x the best fp32 peer ({best[2]}{isa(best)})"
                                 + (target(v, 1.3) if r is sf32 else ""))
                for o in refs:
                    parts.append(f"{fmt(ratio(st(r, 'sps'), st(o, 'sps')), '.2f')}x {o[2]}{isa(o)}")
            if role == "sf-bf16x3":
                parts.append(f"sentences/s {fmt(ratio(st(r, 'sps'), st(sf32, 'sps')), '.2f')}x our own f32's "
                             f"({sf32[2]})")
        elif role == "sf-bf16":
            if b == 1:
                v = ratio(st(sf32, "p50"), st(r, "p50"))
                parts.append(f"{fmt(v, '.2f')}x the speed of our own f32 ({sf32[2]}; sentences/s ratio: its p50 / this p50)"
                             + target(v, 1.3))
            else:
                v = ratio(st(r, "sps"), st(sf32, "sps"))
                parts.append(f"sentences/s {fmt(v, '.2f')}x our own f32's ({sf32[2]})" + target(v, 1.0))
            parts.append(cos(r, ref, 0.9999))
        elif role == "sf-int8":
            v = ratio(st(r, "sps"), st(ort8, "sps"))
            if v is not None:
                parts.append(f"sentences/s {v:.2f}x {ort8[2]}'s{isa(ort8)}"
                             + (target(v, 1.3) if b != 1 else ""))
            parts.append(f"sentences/s {fmt(ratio(st(r, 'sps'), st(sf32, 'sps')), '.2f')}x our own f32's "
                         f"({sf32[2]})")
            parts.append(cos(r, ref, 0.99))
        if parts:
            print(f"    {name}: " + "; ".join(parts))
    if ort32:
        for r in srows:
            if r[1] == "ort-int8":
                c = min_cos(f"{out}/row{r[3]}.bin", f"{out}/row{ort32[3]}.bin")
                print(f"    {r[2]}: min cos to onnxruntime fp32's embeddings {fmt(c, '.6f')}")


def main():
    ap = argparse.ArgumentParser()
    for a in ("rows", "results", "out", "gemm", "bound", "optimizer", "sentences", "load", "cpu"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--caps", help="file stating the instruction set of each row, printed under the tables")
    ap.add_argument("--gemm-note", default="", help="said of the matmul measurement (e.g. its cap)")
    for a in ("repeat", "threads", "batch"):
        ap.add_argument("--" + a, type=int, required=True)
    args = ap.parse_args()

    rows = [r + ["native"] * (5 - len(r)) for r in read_tsv(args.rows)]  # section, role, name, index, isa
    runs, precision = {}, {}
    for section, i, _run, status, sps, cpu, rss, p50, p99, *rest in read_tsv(args.results):
        runs.setdefault(i, []).append((status, num(sps), num(cpu), num(rss), num(p50), num(p99)))
        if rest and rest[0]:
            precision[i] = rest[0]
    # A row that reports its inference precision (OpenVINO's) carries it in its name.
    rows = [[s, role, f"{name}, {precision[i]}" if i in precision else name, i, isa]
            for s, role, name, i, isa in rows]
    show_isa = any(r[4] != "native" for r in rows)
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
          f"{'s' if measured != 1 else ''} (one before each repetition of the rows)"
          f"{'; ' + args.gemm_note if args.gemm_note else ''}:")
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
        for _s, role, name, i, _isa in srows:
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
        isa_head = f" {'ISA':<17}" if show_isa else ""
        head = (f"{'peer':<40}{isa_head} {'sentences/s':>11} {'vs pytorch':>10} {'of bound':>8} {'p50 ms':>8} "
                f"{'p99 ms':>8} {'peak RSS MiB':>12} {'CPU s':>6} {'sent/CPU-s':>10} {'min cos vs sf':>13}")
        print(head)
        print("-" * len(head))
        for _s, role, name, i, isa in srows:
            st = stats[i]
            isa_col = f" {isa:<17}" if show_isa else ""
            if st["sps"] is None:
                print(f"{name:<40}{isa_col} {'failed':>11}")
                continue
            ratio = f"{st['sps'] / torch_best:.2f}x" if torch_best else "-"
            of_bound = f"{100 * st['sps'] / bound_sps:.0f}%" if bound_sps else "-"
            per_cpu = n_sentences / st["cpu"] if st["cpu"] else None
            cos = min_cos(f"{args.out}/row{i}.bin", ref_path) if ref_path else None
            runs_note = "" if st["n"] == st["tries"] else f" ({st['n']}/{st['tries']} runs ok)"
            print(f"{name:<40}{isa_col} {st['sps']:>11.1f} {ratio:>10} {of_bound:>8} {fmt(st['p50'], '.2f'):>8} "
                  f"{fmt(st['p99'], '.2f'):>8} {fmt(st['rss'], '.0f'):>12} {fmt(st['cpu'], '.2f'):>6} "
                  f"{fmt(per_cpu, '.0f'):>10} {fmt(cos, '.6f'):>13}{runs_note}")
        print_targets(b, srows, stats, precision, args.out)

    if args.caps:
        print()
        with open(args.caps) as f:
            for line in f:
                print(line.rstrip())
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
