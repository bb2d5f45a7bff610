"""How an Embedder's workers and kernel threads serve `encode` calls of 32 texts: one
call after another (a lone client), and from two Python threads at once.

    python bindings/python/bench/worker_threads.py MODEL_DIR SENTENCES_FILE [--rounds N]

Prints texts/s per setting and round (settings alternated within each round). Run it
on a quiet machine with the release wheel installed (scripts/compare-python.sh builds
one into target/compare-python/venv).
"""
import argparse
import threading
import time

import streamfuse

SETTINGS = [
    {},
    {"workers": 2, "kernel_threads": 2},
    {"workers": 1, "kernel_threads": 2},
    {"workers": 1, "kernel_threads": 1},
]


def one_after_another(e, texts):
    for i in range(0, 128, 32):
        e.encode(texts[i:i + 32])
    t = time.perf_counter()
    for i in range(0, 512, 32):
        e.encode(texts[i:i + 32])
    return 512 / (time.perf_counter() - t)


def two_threads(e, texts):
    def work():
        for i in range(0, 512, 32):
            e.encode(texts[i:i + 32])

    t = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return 1024 / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("sentences")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    texts = [line.strip() for line in open(a.sentences) if line.strip()]
    texts.sort(key=len, reverse=True)
    for r in range(a.rounds):
        for kw in SETTINGS:
            e = streamfuse.Embedder(a.model, **kw)
            seq = one_after_another(e, texts)
            par = two_threads(e, texts)
            print(f"round {r + 1} {kw or 'default'}: one after another {seq:.0f} texts/s; "
                  f"two threads at once {par:.0f} texts/s", flush=True)
            del e


if __name__ == "__main__":
    main()
