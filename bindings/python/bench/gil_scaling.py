"""Whether encode releases the GIL: texts/s of two Python threads, each with its own
Embedder of one worker on one kernel thread, calling encode on batches of 8 at once,
against one such thread alone. Runs alternate (one, two, one, two, ...) and the
medians are printed with their ratio (issue 33's target on 2 cores: >= 1.7).

    python gil_scaling.py MODEL_DIR SENTENCES_FILE [--rounds 5] [--batches 40]
"""

import argparse
import os
import platform
import statistics
import threading
import time

import streamfuse


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rate(embedders, texts, batches):
    """Texts/s of one thread per embedder, each encoding `batches` batches of 8, and
    the process's CPU seconds per wall second meanwhile (above 1 only when two
    workers ran at once: each embedder has one worker on one kernel thread)."""
    barrier = threading.Barrier(len(embedders) + 1)

    def work(e, offset):
        barrier.wait()
        for i in range(batches):
            at = (offset + 8 * i) % (len(texts) - 8)
            e.encode(texts[at:at + 8], batch_size=8)

    threads = [threading.Thread(target=work, args=(e, 97 * k)) for k, e in enumerate(embedders)]
    for t in threads:
        t.start()
    barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return len(embedders) * batches * 8 / wall, (time.process_time() - cpu) / wall


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model")
    p.add_argument("sentences")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=40)
    a = p.parse_args()
    texts = [l for l in open(a.sentences, encoding="utf-8").read().splitlines() if l.strip()]
    e1 = streamfuse.Embedder(a.model, workers=1, kernel_threads=1)
    e2 = streamfuse.Embedder(a.model, workers=1, kernel_threads=1)
    rate([e1, e2], texts, 4)  # warm-up: plans for the lengths
    one, two = [], []
    for _ in range(a.rounds):
        one.append(rate([e1], texts, a.batches))
        two.append(rate([e1, e2], texts, a.batches))
    print(f"cpu: {cpu_name()} ({os.cpu_count()} cpus), tier {streamfuse.cpu_tier()}, "
          f"load average before: {os.getloadavg()[0]:.2f}")
    medians = []
    for name, runs in (("one thread: ", one), ("two threads:", two)):
        m = statistics.median(r for r, _ in runs)
        medians.append(m)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name} {m:.1f} texts/s, {cpu:.2f} CPU s per wall s (median of {a.rounds}: "
              f"{', '.join(f'{r:.1f}' for r, _ in runs)})")
    print(f"ratio: {medians[1] / medians[0]:.2f}")


if __name__ == "__main__":
    main()
