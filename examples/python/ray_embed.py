"""Embeds a corpus file (one text a line) with Ray Data and streamfuse, and writes the
vectors to Parquet: ``map_batches`` over an actor class that holds one
``streamfuse.Embedder`` (one copy of the weights per actor, its worker threads inside).

    python ray_embed.py --input corpus.txt --output out/ --model MODEL_DIR \
        [--actors 2] [--batch-size 256] [--address auto]

``--address`` is the Ray cluster to join (``auto``: the one ``ray start`` runs on this
node; a ``HOST:6379`` address; none: a Ray instance started for this run and shut
down after it). Each actor runs its Embedder with ``--workers`` worker threads
(default: this node's cores shared between the actors, so actors do not oversubscribe
a node) and asks Ray for ``--cpus-per-actor`` CPUs (default: the node's cores less
one, shared between the actors): the CPU left over is for Ray Data's read and write
tasks, which never get scheduled when the actors hold every CPU (the pipeline then
waits forever). Ray does not pin threads to its CPU count, so the workers still use
every core. ``--no-ray`` runs the same Embedder in a plain
loop in this process instead (the baseline the Ray figures are compared with). Either
way it prints one line: texts, seconds from the start of the pipeline (model loading
included) to the last Parquet file written, texts/s.

Output: Parquet files in ``--output``, columns ``text`` (string) and ``embedding``
(a fixed-size list of float32, the model's width; L2-normalised).

Multi-node: start the head with ``ray start --head`` and each other node with
``ray start --address HEAD:6379``; every node needs the same Python environment
(scripts/setup-ray.sh) and the model folder at the same path (``--model`` is read by
the actors where they run); ``--input`` and ``--output`` must be paths every node
reads and writes (a shared filesystem, or ``s3://`` and the like, which Ray Data
reads and writes directly). Then run this script on any node with ``--address auto``.
"""

import argparse
import os
import time


class EmbedBatches:
    """A Ray Data actor: one streamfuse.Embedder, loaded once when the actor starts,
    embedding each batch it is handed."""

    def __init__(self, model: str, workers: int, batch_size: int) -> None:
        import streamfuse

        self.embedder = streamfuse.Embedder(model, workers=workers)
        self.batch_size = batch_size

    def __call__(self, batch):
        texts = [str(t) for t in batch["text"]]
        return table(texts, self.embedder.encode(texts, batch_size=self.batch_size))


def table(texts, vectors):
    """The output's rows: each text and its vector (a fixed-size list of float32)."""
    import pyarrow as pa

    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    emb = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    return pa.table({"text": pa.array(texts, type=pa.string()), "embedding": emb})


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]


def without_ray(args, workers):
    """The baseline: the same Embedder in a loop over chunks of the batch size, one
    Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = time.perf_counter()
    texts = read_lines(args.input)
    actor = EmbedBatches(args.model, workers, args.embed_batch_size)
    parts = [actor({"text": texts[i:i + args.batch_size]})
             for i in range(0, len(texts), args.batch_size)]
    os.makedirs(args.output, exist_ok=True)
    pq.write_table(pa.concat_tables(parts), os.path.join(args.output, "part-0.parquet"))
    return len(texts), time.perf_counter() - start


def with_ray(args, workers):
    import ray

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    try:
        start = time.perf_counter()
        ds = ray.data.read_text(os.path.abspath(args.input))
        ds = ds.filter(lambda row: bool(row["text"].strip()))
        ds = ds.map_batches(
            EmbedBatches,
            fn_constructor_kwargs={"model": os.path.abspath(args.model), "workers": workers,
                                   "batch_size": args.embed_batch_size},
            batch_size=args.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=args.actors),
            num_cpus=args.cpus_per_actor,
        )
        ds.write_parquet(os.path.abspath(args.output))
        seconds = time.perf_counter() - start
        n = ray.data.read_parquet(os.path.abspath(args.output)).count()
    finally:
        ray.shutdown()
    return n, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="the corpus: one text a line")
    ap.add_argument("--output", required=True, help="a folder for the Parquet files")
    ap.add_argument("--model", default=os.environ.get("STREAMFUSE_MODEL_DIR"),
                    help="a sentence-transformers folder (default $STREAMFUSE_MODEL_DIR)")
    ap.add_argument("--actors", type=int, default=1, help="Embedder actors (default 1)")
    ap.add_argument("--batch-size", type=int, default=256,
                    help="texts Ray hands an actor at a time (default 256)")
    ap.add_argument("--embed-batch-size", type=int, default=32,
                    help="encode's batch_size inside an actor (default 32)")
    ap.add_argument("--workers", type=int, default=None,
                    help="Embedder workers per actor (default: this node's cores / actors)")
    ap.add_argument("--cpus-per-actor", type=float, default=None,
                    help="CPUs each actor asks Ray for (default: (this node's cores - 1) / "
                         "actors, at least 0.25: one CPU stays free for reads and writes)")
    ap.add_argument("--address", default=None,
                    help="the Ray cluster: auto, HOST:PORT, or none for a local instance")
    ap.add_argument("--no-ray", action="store_true",
                    help="the baseline: the same Embedder in a plain loop, no Ray")
    args = ap.parse_args()
    if not args.model:
        ap.error("--model (or STREAMFUSE_MODEL_DIR) names the model folder")
    if args.actors < 1 or args.batch_size < 1 or args.embed_batch_size < 1:
        ap.error("--actors, --batch-size and --embed-batch-size must be at least 1")
    cores = os.cpu_count() or 1
    if args.cpus_per_actor is None:
        args.cpus_per_actor = max(0.25, (cores - 1) / args.actors)
    workers = args.workers or max(1, cores // args.actors)
    if args.no_ray:
        n, seconds = without_ray(args, workers=args.workers or cores)
        how = "no Ray (plain loop, one process)"
    else:
        n, seconds = with_ray(args, workers)
        how = (f"Ray Data, {args.actors} actor(s) of {workers} worker(s) "
               f"({args.cpus_per_actor:g} CPU reserved each)")
    print(f"{how}: {n} texts in {seconds:.2f} s: {n / seconds:.0f} texts/s -> {args.output}")


if __name__ == "__main__":
    main()
