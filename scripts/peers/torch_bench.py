#!/usr/bin/env python3
"""PyTorch peer for the MiniLM comparison: the same BERT forward as streamfuse's.

Weights come from model.safetensors (header parsed by hand, tensors from numpy),
token ids from the `tokenizers` package. As sentence-transformers' encode() does,
sentences are sorted by token length and batched with their neighbours, each batch
padded to its longest sentence (common.py); the forward pass is the Hugging Face BERT one
(torch.nn.functional linear / layer_norm / gelu, scaled_dot_product_attention with
the padding mask), then mean pooling and L2 normalisation.

    python torch_bench.py --model DIR --sentences FILE [--batch 32] [--threads 2] [--out FILE]
        [--fp32-precision bf16]

--fp32-precision bf16 sets `torch.backends.mkldnn.matmul.fp32_precision`, so that the
fp32 products run through oneDNN in bf16 (AMX where the CPU has it): what a PyTorch
user who trades accuracy for speed on such a CPU turns on. Its products are single
bf16 products (bf16 accuracy, like streamfuse's bf16 rows), not f32 ones.

Prints `peak RSS: X MiB` (ru_maxrss), `p50_ms:`/`p99_ms:` (latency of one forward
call: padding a batch, the forward pass, the embeddings as numpy; per sentence with
--batch 1) and `sentences/s: X`; --out writes the embeddings as little-endian f32
rows in input order.
"""

import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def load_weights(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=8 + n + start)
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


class Bert:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = load_weights(os.path.join(model_dir, "model.safetensors"))

    def forward(self, ids, mask):
        w, cfg = self.w, self.cfg
        h = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        dh = h // heads
        eps = cfg["layer_norm_eps"]
        b, n = ids.shape
        x = (F.embedding(ids, w["embeddings.word_embeddings.weight"])
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = F.layer_norm(x, (h,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        attn_mask = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for l in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{l}."
            lin = lambda t, name: F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])
            split = lambda t: t.view(b, n, heads, dh).transpose(1, 2)
            q = split(lin(x, "attention.self.query"))
            k = split(lin(x, "attention.self.key"))
            v = split(lin(x, "attention.self.value"))
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            ctx = ctx.transpose(1, 2).reshape(b, n, h)
            x = F.layer_norm(lin(ctx, "attention.output.dense") + x, (h,),
                             w[p + "attention.output.LayerNorm.weight"],
                             w[p + "attention.output.LayerNorm.bias"], eps)
            f = lin(F.gelu(lin(x, "intermediate.dense")), "output.dense")
            x = F.layer_norm(f + x, (h,), w[p + "output.LayerNorm.weight"],
                             w[p + "output.LayerNorm.bias"], eps)
        m = mask[:, :, None].to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def main():
    args = common.arguments(optional=("--fp32-precision",))
    torch.set_num_threads(args.threads)
    if args.fp32_precision:
        torch.backends.mkldnn.matmul.fp32_precision = args.fp32_precision
    model = Bert(args.model)

    def forward(ids, mask):
        with torch.inference_mode():
            return model.forward(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()

    common.run(
        args,
        forward,
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}"
        + (f", mkldnn fp32_precision {args.fp32_precision}" if args.fp32_precision else ""),
    )


if __name__ == "__main__":
    main()
