"""The peers of the families comparison (scripts/compare-families.sh): random-
initialised sentence-transformers folders of real size, and PyTorch
(sentence-transformers' encode) and ONNX Runtime timing them on the same calls as
streamfuse's `examples/embed`.

    family_bench.py make --kind modernbert|qwen3 --tokenizer DIR --out DIR
    family_bench.py export --folder DIR --onnx FILE
    family_bench.py torch|ort --folder DIR [--onnx FILE] --sentences FILE --batch N
        --threads T --out FILE.npy

The folders: ModernBERT-base's config (22 layers, hidden 768, 12 heads, GeGLU 1152,
local window 128 every layer but each third) and Qwen3-Embedding-0.6B's (28 layers,
hidden 1024, 16 query heads on 8 key/value heads of 128, SwiGLU 3072), weights drawn as
transformers initialises them (seeded), with mean pooling (ModernBERT) or last-token
pooling (Qwen3) and Normalize. Both use the tokenizer folder given (all-MiniLM-L6-v2's
WordPiece, so every engine sees the same tokens, as many as a real tokenizer makes of
English), so the vocabulary is 30522 rows, not the models' own.

The calls: sentences sorted longest first by characters (as encode() sorts them), cut
into calls of `batch` neighbours; each call is one encode() (PyTorch) or one padded
session.run plus pooling (ONNX Runtime). Prints `p50_ms`, `p99_ms`, `sentences/s`,
`peak_rss_mib` as examples/embed does, and saves the vectors in input order.
"""

import argparse
import os
import resource
import shutil
import sys
import time

import numpy as np


def read(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]


def calls(sentences, batch):
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    return [order[s : s + batch] for s in range(0, len(order), batch)]


def report(sentences, latencies, secs):
    lat = sorted(latencies)
    pct = lambda p: lat[min(len(lat), max(1, int(np.ceil(p / 100 * len(lat))))) - 1]
    print(f"peak_rss_mib: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    print(f"p50_ms: {pct(50):.3f}")
    print(f"p99_ms: {pct(99):.3f}")
    print(f"sentences/s: {len(sentences) / secs:.1f}")


def make(kind, tokenizer, out):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel, Qwen3Config, Qwen3Model

    torch.manual_seed(7)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if kind == "modernbert":
        cfg = ModernBertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                               cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                               bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
        model, pooling, dim = ModernBertModel(cfg), "mean", cfg.hidden_size
    elif kind == "qwen3":
        cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072,
                          num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                          head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          tie_word_embeddings=True)
        model, pooling, dim = Qwen3Model(cfg), "lasttoken", cfg.hidden_size
    else:
        sys.exit(f"unknown kind {kind}")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    word = Transformer(tmp, max_seq_length=256)
    st = SentenceTransformer(modules=[word, Pooling(dim, pooling_mode=pooling), Normalize()],
                             device="cpu")
    shutil.rmtree(out, ignore_errors=True)
    st.save(out)
    shutil.rmtree(tmp, ignore_errors=True)


def load_st(folder, threads):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    return SentenceTransformer(folder, device="cpu")


def export(folder, onnx):
    import torch

    st = load_st(folder, 2)
    model = st[0].auto_model.eval()
    enc = st.tokenize(["a short text", "a somewhat longer text to pad the batch"])

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(Wrap(model), (enc["input_ids"], enc["attention_mask"]), onnx,
                          input_names=["input_ids", "attention_mask"], output_names=["states"],
                          dynamic_axes={"input_ids": {0: "b", 1: "t"},
                                        "attention_mask": {0: "b", 1: "t"},
                                        "states": {0: "b", 1: "t"}},
                          opset_version=17, dynamo=False)


def run_torch(args, sentences):
    import torch

    st = load_st(args.folder, args.threads)
    out = np.zeros((len(sentences), st.get_sentence_embedding_dimension()), np.float32)
    st.encode(sentences[:4], batch_size=args.batch)  # warm up
    lat, start = [], time.perf_counter()
    with torch.inference_mode():
        for idx in calls(sentences, args.batch):
            t = time.perf_counter()
            v = st.encode([sentences[i] for i in idx], batch_size=args.batch,
                          convert_to_numpy=True)
            lat.append((time.perf_counter() - t) * 1e3)
            out[idx] = v
    secs = time.perf_counter() - start
    np.save(args.out, out)
    report(sentences, lat, secs)


def run_ort(args, sentences):
    import onnxruntime as ort

    st = load_st(args.folder, args.threads)
    pooling = st[1].pooling_mode if hasattr(st[1], "pooling_mode") else None
    last = "lasttoken" in str(pooling) or "lasttoken" in str(st[1].get_config_dict())
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(args.onnx, so, providers=["CPUExecutionProvider"])

    def encode(texts):
        enc = st.tokenize(texts)
        ids, mask = enc["input_ids"].numpy(), enc["attention_mask"].numpy()
        (h,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        if last:
            v = h[np.arange(len(texts)), mask.sum(1) - 1]
        else:
            m = mask[..., None].astype(np.float32)
            v = (h * m).sum(1) / m.sum(1)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    encode(sentences[:4])
    out = None
    lat, start = [], time.perf_counter()
    for idx in calls(sentences, args.batch):
        t = time.perf_counter()
        v = encode([sentences[i] for i in idx])
        lat.append((time.perf_counter() - t) * 1e3)
        if out is None:
            out = np.zeros((len(sentences), v.shape[1]), np.float32)
        out[idx] = v
    secs = time.perf_counter() - start
    np.save(args.out, out)
    report(sentences, lat, secs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["make", "export", "torch", "ort"])
    p.add_argument("--kind")
    p.add_argument("--tokenizer")
    p.add_argument("--out")
    p.add_argument("--folder")
    p.add_argument("--onnx")
    p.add_argument("--sentences")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.what == "make":
        make(a.kind, a.tokenizer, a.out)
    elif a.what == "export":
        export(a.folder, a.onnx)
    else:
        sentences = read(a.sentences)
        (run_torch if a.what == "torch" else run_ort)(a, sentences)


if __name__ == "__main__":
    main()
