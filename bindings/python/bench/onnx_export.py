"""An ONNX export of a sentence-transformers BERT folder for fastembed's custom-model
API (used by compare.py through scripts/compare-python.sh).

    python onnx_export.py --model ST_FOLDER --out ONNX_FOLDER

The model is scripts/peers/ort_export.py's torch BERT (Hugging Face's eager BertModel
under the checkpoint's own names, loaded from the folder's model.safetensors) without
its pooling: the graph ends at ``last_hidden_state``, as the ONNX models fastembed
ships do (fastembed mean-pools and normalises it itself). Exported with
``torch.onnx.export`` (the TorchScript exporter, opset 17); inputs ``input_ids``,
``attention_mask``, ``token_type_ids`` (int64, batch and sequence axes dynamic).
(transformers' own BertModel does not trace: its mask helpers come out ignoring the
padding.) Copies the tokenizer files beside ``model.onnx``, then checks ONNX Runtime
against torch on two padded batches of different shapes and fails when they differ by
more than 1e-4. Does nothing when ``model.onnx`` is newer than the weights and this
script.
"""

import argparse
import os
import shutil
import sys

TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.txt")
PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                     "scripts", "peers")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = os.path.join(args.out, "model.onnx")
    weights = os.path.join(args.model, "model.safetensors")
    newest = max(os.path.getmtime(weights), os.path.getmtime(__file__))
    if os.path.exists(target) and os.path.getmtime(target) > newest:
        print(f"{target} is up to date")
        return

    import numpy as np
    import onnxruntime as ort
    import torch

    sys.path.insert(0, PEERS)
    import common  # noqa: E402
    import ort_export  # noqa: E402

    bert, _, _ = ort_export.build(args.model)

    class Hidden(torch.nn.Module):
        """The BERT's embeddings and layers: the last hidden states, unpooled."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            x = self.inner.embeddings(input_ids, token_type_ids)
            ext = attention_mask[:, None, None, :].to(x.dtype)
            ext = (1.0 - ext) * torch.finfo(x.dtype).min
            for layer in self.inner.encoder.layer:
                x = layer(x, ext)
            return x

    model = Hidden(bert).eval()
    tok = common.tokenizer(args.model)

    def batch(texts):
        enc = [e.ids for e in tok.encode_batch(texts)]
        ids, mask = common.pad(enc, list(range(len(enc))))
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "sequence"} for n in names + ["last_hidden_state"]}
    traced = batch(["A short one.", "A somewhat longer sentence, padded less than the first."])
    os.makedirs(args.out, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, tuple(torch.from_numpy(traced[n]) for n in names), target,
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(args.model, f)):
            shutil.copy(os.path.join(args.model, f), os.path.join(args.out, f))

    # The traced batch, and one of another shape (the axes must really be dynamic).
    other = batch(["One.", "Two words.", "And a third, longer text with more tokens in it."])
    sess = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    diff = 0.0
    for feed in (traced, other):
        with torch.no_grad():
            want = model(*(torch.from_numpy(feed[n]) for n in names)).numpy()
        got = sess.run(None, feed)[0]
        mask = feed["attention_mask"][..., None].astype(bool)
        diff = max(diff, float(np.abs(np.where(mask, got - want, 0)).max()))
    print(f"exported {target}; ONNX Runtime vs torch, largest difference: {diff:.2e}")
    if diff > 1e-4:
        os.remove(target)
        raise SystemExit("the export disagrees with torch")


if __name__ == "__main__":
    main()
