#!/usr/bin/env python3
"""ONNX models of all-MiniLM-L6-v2 for the ONNX Runtime peer, made once and cached.

    python ort_export.py --model DIR --dir OUT_DIR [--threads 2]

From the same model.safetensors every other peer loads (read by torch_bench.py's
loader), builds the BERT forward in torch as Hugging Face's eager BertModel writes it
(nn.Linear / nn.LayerNorm / nn.Embedding under the checkpoint's own names, attention
as matmul, divide by sqrt(head size), add the extended padding mask, softmax, matmul,
exact erf GELU), with the pooling in the graph: mean over the attention mask, then L2
normalisation. Graph inputs: input_ids, attention_mask, token_type_ids (int64,
[batch, sequence], both axes dynamic); output: `embedding`, [batch, 384], the
pooled and normalised sentence embedding, the same thing every peer returns.

Writes into OUT_DIR:
  minilm-fp32.onnx       torch.onnx.export (TorchScript exporter, opset 17)
  minilm-fp32-opt.onnx   onnxruntime.transformers.optimizer.optimize_model(
                         model_type='bert', num_heads=12, hidden_size=384)
  minilm-int8.onnx       onnxruntime.quantization.quantize_dynamic of the optimised
                         model, weight_type=QInt8 (activations are uint8 in dynamic
                         quantisation, so U8S8: the pairing ONNX Runtime's quantisation
                         guide names first for x86-64), per-tensor, no reduce_range,
                         after ONNX Runtime's quant_pre_process (shape inference only)
  minilm-int8-pc.onnx    the same with per_channel=True (a scale per output column of
                         each weight): quantize_dynamic's default is per-tensor, which
                         costs this model much more accuracy
  optimizer.txt          the optimiser's fused-operator counts and warnings, printed
                         by compare-peers.sh with its table
  optimizer-log.txt      everything the optimiser and the quantiser logged
  stamp                  what the files were made from; when it matches, nothing is
                         redone

Checks the exported and the optimised model against the torch module on a few padded
batches (largest absolute difference of the embeddings) and fails when they disagree.
"""

import argparse
import hashlib
import io
import json
import logging
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from torch_bench import load_weights  # noqa: E402


class SelfAttention(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads, self.dh = heads, h // heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)

    def split(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.dh)).permute(0, 2, 1, 3)

    def forward(self, x, ext_mask):
        q = self.split(self.query(x))
        k = self.split(self.key(x))
        v = self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        probs = F.softmax(scores + ext_mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.heads * self.dh,))


class Output(nn.Module):
    def __init__(self, d_in, h, eps):
        super().__init__()
        self.dense = nn.Linear(d_in, h)
        self.LayerNorm = nn.LayerNorm(h, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, h, heads, eps):
        super().__init__()
        self.self = SelfAttention(h, heads)
        self.output = Output(h, h, eps)

    def forward(self, x, ext_mask):
        return self.output(self.self(x, ext_mask), x)


class Intermediate(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.dense = nn.Linear(h, inter)

    def forward(self, x):
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.attention = Attention(h, cfg["num_attention_heads"], eps)
        self.intermediate = Intermediate(h, cfg["intermediate_size"])
        self.output = Output(cfg["intermediate_size"], h, eps)

    def forward(self, x, ext_mask):
        a = self.attention(x, ext_mask)
        return self.output(self.intermediate(a), a)


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], h)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg["layer_norm_eps"])
        positions = torch.arange(cfg["max_position_embeddings"]).unsqueeze(0)
        self.register_buffer("position_ids", positions, persistent=False)

    def forward(self, input_ids, token_type_ids):
        n = input_ids.size(1)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(self.position_ids[:, :n])
        return self.LayerNorm(x)


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layer = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))


class SentenceBert(nn.Module):
    """BertModel's embeddings and encoder under the checkpoint's names, then mean
    pooling and L2 normalisation."""

    def __init__(self, cfg):
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)

    def forward(self, input_ids, attention_mask, token_type_ids):
        x = self.embeddings(input_ids, token_type_ids)
        ext = attention_mask[:, None, None, :].to(x.dtype)
        ext = (1.0 - ext) * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            x = layer(x, ext)
        m = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def build(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = SentenceBert(cfg)
    weights = load_weights(os.path.join(model_dir, "model.safetensors"))
    weights = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in weights.items()}
    wanted = set(model.state_dict())
    missing = sorted(wanted - set(weights))
    if missing:
        raise SystemExit(f"model.safetensors lacks {missing}")
    model.load_state_dict({k: weights[k] for k in wanted})
    unused = sorted(k for k in weights if k not in wanted)
    return model.eval(), cfg, unused


def sample_batches(model_dir, sentences_path, sizes=(1, 3, 32)):
    """A few padded batches of real sentences (longest first, as the peers batch)."""
    tok = common.tokenizer(model_dir)
    encoded = [e.ids for e in tok.encode_batch(common.read_sentences(sentences_path))]
    out = []
    for size in sizes:
        idx = common.length_sorted_batches(encoded, size)[len(encoded) // size // 2]
        out.append(common.pad(encoded, idx))
    return out


def stamp_of(model_dir):
    h = hashlib.sha256()
    for path in (__file__, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_bench.py")):
        with open(path, "rb") as f:
            h.update(f.read())
    st = os.stat(os.path.join(model_dir, "model.safetensors"))
    h.update(f"{os.path.realpath(model_dir)} {st.st_size} {st.st_mtime_ns}".encode())
    import onnxruntime

    h.update(f"torch {torch.__version__} onnxruntime {onnxruntime.__version__}".encode())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--sentences", required=True, help="for the agreement check")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    paths = {k: os.path.join(args.dir, f"minilm-{k}.onnx") for k in ("fp32", "fp32-opt", "int8", "int8-pc")}
    stamp_path = os.path.join(args.dir, "stamp")
    stamp = stamp_of(args.model)
    if all(os.path.exists(p) for p in paths.values()) and os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if f.read().strip() == stamp:
                print(f"ONNX models up to date in {args.dir}")
                return
    if os.path.exists(stamp_path):
        os.remove(stamp_path)

    torch.set_num_threads(args.threads)
    model, cfg, unused = build(args.model)
    if unused:
        print(f"weights not used by the sentence embedding: {', '.join(unused)}")
    ids, mask = common.pad([[101, 2023, 2003, 102], [101, 102]], [0, 1])
    dummy = tuple(torch.from_numpy(a) for a in (ids, mask, np.zeros_like(ids)))
    axes = {0: "batch", 1: "sequence"}
    print(f"exporting with torch {torch.__version__} (TorchScript exporter, opset 17)")
    torch.onnx.export(
        model,
        dummy,
        paths["fp32"],
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["embedding"],
        dynamic_axes={
            "input_ids": axes,
            "attention_mask": axes,
            "token_type_ids": axes,
            "embedding": {0: "batch"},
        },
        opset_version=17,
        do_constant_folding=True,
        dynamo=False,
    )

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    # The optimiser and the quantiser report through `logging`: keep what they say.
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)

    opt = optimize_model(
        paths["fp32"],
        model_type="bert",
        num_heads=cfg["num_attention_heads"],
        hidden_size=cfg["hidden_size"],
    )
    fused = opt.get_fused_operator_statistics()
    fully = opt.is_fully_optimized(fused)
    opt.save_model_to_file(paths["fp32-opt"])
    # ONNX Runtime's quantisation pre-processing, shape inference only (the model is
    # optimised already): its symbolic shape inference types the outputs of the fused
    # com.microsoft ops (Attention, ...), which the quantiser needs.
    shaped = os.path.join(args.dir, "minilm-fp32-opt-shapes.onnx")
    quant_pre_process(paths["fp32-opt"], shaped, skip_optimization=True)
    quantize_dynamic(shaped, paths["int8"], weight_type=QuantType.QInt8)
    quantize_dynamic(shaped, paths["int8-pc"], weight_type=QuantType.QInt8, per_channel=True)
    os.remove(shaped)
    logging.getLogger().removeHandler(handler)

    # Agreement of the exported models with the torch module they came from.
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {k: ort.InferenceSession(p, so, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    diffs = {k: 0.0 for k in sessions}
    for ids, mask in sample_batches(args.model, args.sentences):
        types = np.zeros_like(ids)
        with torch.inference_mode():
            ref = model(*(torch.from_numpy(a) for a in (ids, mask, types))).numpy()
        for k, s in sessions.items():
            got = s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
            diffs[k] = max(diffs[k], float(np.abs(got - ref).max()))

    lines = [
        f"torch {torch.__version__}, onnx opset 17, onnxruntime {ort.__version__}",
        "optimize_model(model_type='bert', num_heads=%d, hidden_size=%d) fused operators: %s"
        % (cfg["num_attention_heads"], cfg["hidden_size"],
           ", ".join(f"{k} {v}" for k, v in fused.items() if v)),
        f"is_fully_optimized: {fully}",
        "node types after optimisation: "
        + ", ".join(f"{k} {v}" for k, v in sorted(count_ops(paths["fp32-opt"]).items())),
        "node types after quantize_dynamic(QInt8): "
        + ", ".join(f"{k} {v}" for k, v in sorted(count_ops(paths["int8"]).items())),
        "node types after quantize_dynamic(QInt8, per_channel): "
        + ", ".join(f"{k} {v}" for k, v in sorted(count_ops(paths["int8-pc"]).items())),
        "largest |embedding - torch module's| on 3 sample batches: "
        + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()),
    ]
    said = [l for l in log.getvalue().splitlines() if l.startswith(("WARNING", "ERROR"))]
    lines += [f"optimiser/quantiser said: {l}" for l in said] or ["optimiser/quantiser warnings: none"]
    with open(os.path.join(args.dir, "optimizer.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    with open(os.path.join(args.dir, "optimizer-log.txt"), "w") as f:
        f.write(log.getvalue())
    print(f"(the optimiser's and quantiser's whole log: {args.dir}/optimizer-log.txt)")
    if diffs["fp32"] > 1e-4 or diffs["fp32-opt"] > 1e-4:
        raise SystemExit("the exported model disagrees with the torch module")
    with open(stamp_path, "w") as f:
        f.write(stamp + "\n")


def count_ops(path):
    import onnx

    counts = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


if __name__ == "__main__":
    main()
