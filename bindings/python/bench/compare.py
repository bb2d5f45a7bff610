"""streamfuse's Embedder.encode against sentence-transformers (PyTorch) and fastembed
(ONNX Runtime) on one model, in one run (scripts/compare-python.sh sets it up and
calls it). Prints a markdown table.

    python compare.py --model ST_FOLDER --onnx ONNX_FOLDER --sentences FILE \
        --out DIR [--rounds 3]

Each engine runs in a process of its own (so its peak RSS and its import time are its
own), once per round; the rounds alternate the engines (the order rotates each round)
and the table gives the medians over the rounds. Every process:

1. from before its engine's import to the first embedding of one text: the time a
   fresh process takes to embed (import, model load, first forward);
2. four untimed calls of 32 texts (spread over the lengths), then one timed pass over
   the corpus in calls of 32 texts (16 calls: texts/s, p50/p99 of the calls);
3. one untimed call, then every fourth text of the corpus in a call of its own (128
   calls, every length);
4. its peak RSS (``ru_maxrss``).

The corpus is the sentences file sorted by length, longest first (the order
sentence-transformers' encode sorts into), the same for every engine. The peers run as
their users run them: ``SentenceTransformer(folder, device="cpu").encode(texts,
batch_size=32)`` with torch's default threads; fastembed's ``TextEmbedding`` with its
default threads, on an ONNX export of the same weights added through
``TextEmbedding.add_custom_model`` (mean pooling, normalisation) and loaded from a local
folder; ``streamfuse.Embedder(folder).encode(texts, batch_size=32)`` with its defaults.
The min cosine is over every vector both passes made, against sentence-transformers'
vector of the same text at batch 32.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ENGINES = ("sentence-transformers", "fastembed", "streamfuse")
FASTEMBED_NAME = "local/all-MiniLM-L6-v2-onnx"
# Warm-up calls of 32 texts (spread over the lengths) before the timed pass.
WARMUP = 4
# One text a call: every ONE_STEP-th text of the sorted corpus (all lengths).
ONE_STEP = 4


def load_engine(engine, model, onnx):
    """Imports `engine` and loads the model; returns `embed(texts) -> (n, dim)`."""
    if engine == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        m = SentenceTransformer(model, device="cpu")
        return lambda texts: m.encode(texts, batch_size=32)
    if engine == "fastembed":
        import numpy as np
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        TextEmbedding.add_custom_model(
            model=FASTEMBED_NAME,
            pooling=PoolingType.MEAN,
            normalization=True,
            sources=ModelSource(hf=FASTEMBED_NAME),
            dim=384,
            model_file="model.onnx",
        )
        m = TextEmbedding(model_name=FASTEMBED_NAME, specific_model_path=onnx)
        return lambda texts: np.stack(list(m.embed(texts, batch_size=32)))
    if engine == "streamfuse":
        import streamfuse

        m = streamfuse.Embedder(model)
        return lambda texts: m.encode(texts, batch_size=32)
    raise ValueError(engine)


def child(args):
    """One engine's measurements, printed as one JSON line."""
    with open(args.sorted, encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f]
    start = time.perf_counter()
    embed = load_engine(args.engine, args.model, args.onnx)
    first = embed([texts[0]])
    first_s = time.perf_counter() - start
    assert first.shape[0] == 1

    import resource

    import numpy as np

    calls = [texts[i : i + 32] for i in range(0, len(texts), 32)]
    for c in calls[:: max(1, len(calls) // WARMUP)]:
        embed(c)
    lat, b32 = [], []
    t0 = time.perf_counter()
    for c in calls:
        s = time.perf_counter()
        b32.append(embed(c))
        lat.append(time.perf_counter() - s)
    b32_s = time.perf_counter() - t0
    b32 = np.concatenate(b32)

    singles = texts[:: ONE_STEP]
    embed([texts[0]])
    lat1, one = [], []
    t0 = time.perf_counter()
    for t in singles:
        s = time.perf_counter()
        one.append(embed([t]))
        lat1.append(time.perf_counter() - s)
    one_s = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.save:
        np.save(os.path.join(args.out, f"{args.engine}-b32.npy"), b32.astype(np.float32))
        np.save(os.path.join(args.out, f"{args.engine}-b1.npy"), np.concatenate(one))
    q = lambda v, p: float(np.percentile(np.array(v) * 1e3, p))  # noqa: E731
    print(
        json.dumps(
            {
                "engine": args.engine,
                "first_s": first_s,
                "b32_tps": len(texts) / b32_s,
                "b32_p50": q(lat, 50),
                "b32_p99": q(lat, 99),
                "b1_tps": len(singles) / one_s,
                "b1_p50": q(lat1, 50),
                "b1_p99": q(lat1, 99),
                "rss_mb": rss_mb,
            }
        )
    )


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def versions():
    """The engines' versions, read without importing them."""
    from importlib import metadata

    out = []
    for p in ("streamfuse", "sentence-transformers", "transformers", "torch", "fastembed",
              "onnxruntime", "numpy"):
        try:
            out.append(f"{p} {metadata.version(p)}")
        except metadata.PackageNotFoundError:
            out.append(f"{p} (missing)")
    return ", ".join(out)


def min_cosine(out, engine):
    """The smallest cosine between `engine`'s vectors (batch 32 and one text a call)
    and sentence-transformers' batch-32 vectors of the same texts."""
    import numpy as np

    ref = np.load(os.path.join(out, "sentence-transformers-b32.npy")).astype(np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    worst = 1.0
    for mode, r in (("b32", ref), ("b1", ref[::ONE_STEP])):
        v = np.load(os.path.join(out, f"{engine}-{mode}.npy")).astype(np.float64)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        worst = min(worst, float((v * r).sum(axis=1).min()))
    return worst


def parent(args):
    os.makedirs(args.out, exist_ok=True)
    with open(args.sentences, encoding="utf-8") as f:
        texts = [line.rstrip("\r\n") for line in f if line.strip()]
    # sentence-transformers' order: longest first by characters, ties in input order.
    texts = sorted(texts, key=lambda t: -len(t))
    sorted_path = os.path.join(args.out, "sentences-sorted.txt")
    with open(sorted_path, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    load_before = os.getloadavg()
    results = {e: [] for e in ENGINES}
    for r in range(args.rounds):
        order = ENGINES[r % 3 :] + ENGINES[: r % 3]
        for engine in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", engine,
                   "--model", args.model, "--onnx", args.onnx, "--sorted", sorted_path,
                   "--out", args.out] + (["--save"] if r == 0 else [])
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stderr)
                sys.exit(f"{engine} failed (round {r + 1})")
            line = p.stdout.strip().splitlines()[-1]
            results[engine].append(json.loads(line))
            print(f"round {r + 1} {engine}: {line}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    med = {e: {k: statistics.median(x[k] for x in results[e])
               for k in results[e][0] if k != "engine"} for e in ENGINES}
    cos = {e: min_cosine(args.out, e) for e in ENGINES}
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (other builds share "
          f"the machine); {args.rounds} rounds alternated, medians.")
    print(f"Versions: {versions()}.")
    print(f"Corpus: {len(texts)} texts of {args.sentences}, longest first; batch 32 = "
          f"{(len(texts) + 31) // 32} calls of 32 texts after {WARMUP} warm-up calls; "
          f"1 text = {len(texts[::ONE_STEP])} calls (every {ONE_STEP}th text).")
    print()
    print("| engine | batch 32 texts/s | p50 ms | p99 ms | 1 text texts/s | p50 ms | p99 ms "
          "| peak RSS MB | import to 1st embedding s | min cosine to ST |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in ENGINES:
        m = med[e]
        print(f"| {e} | {m['b32_tps']:.0f} | {m['b32_p50']:.1f} | {m['b32_p99']:.1f} "
              f"| {m['b1_tps']:.0f} | {m['b1_p50']:.2f} | {m['b1_p99']:.2f} "
              f"| {m['rss_mb']:.0f} | {m['first_s']:.2f} | {cos[e]:.7f} |")
    sf, st, fe = med["streamfuse"], med["sentence-transformers"], med["fastembed"]
    print()
    checks = [
        ("batch 32 texts/s vs fastembed", sf["b32_tps"] / fe["b32_tps"], ">= 1.3", sf["b32_tps"] / fe["b32_tps"] >= 1.3),
        ("batch 32 texts/s vs sentence-transformers", sf["b32_tps"] / st["b32_tps"], ">= 1.5", sf["b32_tps"] / st["b32_tps"] >= 1.5),
        ("1 text texts/s vs fastembed", sf["b1_tps"] / fe["b1_tps"], "(no target)", None),
        ("1 text texts/s vs sentence-transformers", sf["b1_tps"] / st["b1_tps"], "(no target)", None),
        ("import to 1st embedding, sentence-transformers / streamfuse", st["first_s"] / sf["first_s"], ">= 1.0", st["first_s"] >= sf["first_s"]),
    ]
    for name, ratio, target, ok in checks:
        verdict = "" if ok is None else (" met" if ok else " NOT met")
        print(f"- streamfuse {name}: {ratio:.2f}x (target {target}){verdict}")
    ok = cos["streamfuse"] >= 0.99999
    print(f"- streamfuse min cosine to sentence-transformers: {cos['streamfuse']:.7f} "
          f"(target >= 0.99999){' met' if ok else ' NOT met'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--sentences")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", dest="engine", choices=ENGINES)
    ap.add_argument("--sorted")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    if args.engine:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
