#!/usr/bin/env python3
"""Regenerates the cross-encoder reranker fixture: tests/data/tiny-reranker/ and its
expected scores, tests/data/tiny-reranker-reference.json. CI does not run this (the
files are committed); run it after changing what the fixture holds.

    python=$(VENV=target/pyref-torch scripts/setup-python.sh torch transformers)
    "$python" scripts/gen-reranker-fixture.py [--tokenizer target/models/all-MiniLM-L6-v2/tokenizer.json]

What it makes:

- A sentence-transformers CrossEncoder folder of a `BertForSequenceClassification`
  with one label, built by transformers from a small config (hidden 32, 2 layers,
  4 heads, feed-forward 64, 64 positions, 2 token types) and initialised at random
  with a fixed seed, with weights large enough that the logits spread (normal with
  standard deviation 0.3, layer norm scales around 1) and every bias and layer-norm
  parameter non-trivial, so a weight loaded into the wrong place shows. Saved as
  transformers saves it (config.json, model.safetensors), with the CrossEncoder's
  activation named in config.json as sentence-transformers v4 writes it
  (`sentence_transformers.activation_fn`: sigmoid).
- Its tokenizer: all-MiniLM-L6-v2's WordPiece tokenizer (tokenizer.json, the one the
  project fetches) with the vocabulary cut down to the special tokens, the printable
  ASCII characters (whole and `##` continuations, so any ASCII word still tokenises)
  and the pieces the fixture's texts use, renumbered in MiniLM's order; other
  characters become [UNK]. tokenizer_config.json says model_max_length 64.
- The reference: for each query and its documents, the pair's token ids and types
  (from transformers' tokenizer, `truncation=True` at 64 tokens, as the CrossEncoder
  runs it), the logit from the model in float32 (padded batch, eval mode) and its
  sigmoid, with the versions that computed them.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LENGTH = 64
SEED = 31

QUERIES = [
    (
        "How do cats spend their day?",
        [
            "The cat sits outside in the sun all afternoon.",
            "A man is playing guitar on the street.",
            "Cats sleep for twelve to sixteen hours a day, and hunt at dawn and dusk.",
            "",
            "How do cats spend their day?",
            "Stock markets fell 3.5% on Tuesday; bonds rallied.",
        ],
    ),
    (
        "Rust memory safety without garbage collection",
        [
            "Rust's ownership and borrowing rules give memory safety without a garbage "
            "collector: every value has one owner, references are checked at compile "
            "time, and memory is freed when its owner goes out of scope. Unsafe blocks "
            "let a program opt out where it must, and the standard library wraps them "
            "in safe interfaces such as Vec, Box, Rc and Arc.",
            "Garbage collection pauses can hurt latency.",
            "The weather in Lisbon is mild in winter.",
            "RUST is also a fungus that grows on plants!",
        ],
    ),
    (
        "what is the boiling point of water at sea level in degrees celsius, and how "
        "does it change with altitude on a mountain such as everest or mont blanc where "
        "the air pressure is much lower than it is near the coast, and does a pressure "
        "cooker in a kitchen at that height make up for the difference when cooking rice "
        "or pasta for dinner",
        [
            "Water boils at 100 degrees.",
            "At high altitude water boils at a lower temperature.",
            "\u00e9t\u00e9 \u2603 caf\u00e9 \u6f22\u5b57",
            "Everest",
        ],
    ),
]

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def small_tokenizer(full: dict, texts: list) -> dict:
    """MiniLM's tokenizer.json with its vocabulary cut to what the fixture needs."""
    from tokenizers import Tokenizer

    whole = Tokenizer.from_str(json.dumps(full))
    whole.no_truncation()
    whole.no_padding()
    vocab = full["model"]["vocab"]
    keep = set(SPECIAL)
    for c in map(chr, range(33, 127)):
        for piece in (c, "##" + c):
            if piece in vocab:
                keep.add(piece)
    for t in texts:
        keep.update(whole.encode(t, add_special_tokens=False).tokens)
    ordered = sorted(keep, key=lambda p: vocab[p])
    new_ids = {p: i for i, p in enumerate(ordered)}
    small = json.loads(json.dumps(full))
    small["model"]["vocab"] = new_ids
    small["truncation"] = None
    small["padding"] = None
    for a in small["added_tokens"]:
        a["id"] = new_ids[a["content"]]
    for name, tok in small["post_processor"]["special_tokens"].items():
        tok["ids"] = [new_ids[name]]
    return small


def randomise(model: torch.nn.Module) -> None:
    """Every parameter drawn again: weights and biases N(0, 0.3²), layer-norm scales
    1 + N(0, 0.2²)."""
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.3 * noise)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tokenizer",
        default=os.path.join(ROOT, "target/models/all-MiniLM-L6-v2/tokenizer.json"),
        help="all-MiniLM-L6-v2's tokenizer.json",
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/tiny-reranker"))
    ap.add_argument(
        "--reference", default=os.path.join(ROOT, "tests/data/tiny-reranker-reference.json")
    )
    args = ap.parse_args()

    with open(args.tokenizer) as f:
        full = json.load(f)
    texts = [q for q, _ in QUERIES] + [d for _, docs in QUERIES for d in docs]
    small = small_tokenizer(full, texts)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(small, f, ensure_ascii=False, separators=(",", ":"))
    special = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "unk_token": "[UNK]",
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                **special,
                "do_lower_case": True,
                "tokenize_chinese_chars": True,
                "strip_accents": None,
                "model_max_length": MAX_LENGTH,
                "tokenizer_class": "BertTokenizer",
            },
            f,
            indent=2,
        )
    with open(os.path.join(args.out, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)

    config = BertConfig(
        vocab_size=len(small["model"]["vocab"]),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH,
        type_vocab_size=2,
        hidden_act="gelu",
        num_labels=1,
        pad_token_id=0,
        architectures=["BertForSequenceClassification"],
    )
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(config)
    randomise(model)
    model.eval()
    model.save_pretrained(args.out, safe_serialization=True)
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    tok = AutoTokenizer.from_pretrained(args.out)
    groups = []
    for query, docs in QUERIES:
        enc = tok(
            [query] * len(docs),
            docs,
            padding=True,
            truncation=True,
            max_length=MAX_LENGTH,
            return_tensors="pt",
        )
        with torch.no_grad():
            logits = model(**enc).logits.squeeze(-1)
        scores = torch.sigmoid(logits)
        pairs = []
        for i, doc in enumerate(docs):
            n = int(enc["attention_mask"][i].sum())
            pairs.append(
                {
                    "document": doc,
                    "input_ids": enc["input_ids"][i][:n].tolist(),
                    "token_type_ids": enc["token_type_ids"][i][:n].tolist(),
                    "logit": float(logits[i]),
                    "score": float(scores[i]),
                }
            )
        ranked = sorted(p["logit"] for p in pairs)
        gap = min(b - a for a, b in zip(ranked, ranked[1:]))
        if gap < 1e-3:
            print(f"query {query[:30]!r}: two logits are {gap} apart; pick other texts or seed",
                  file=sys.stderr)
            return 1
        groups.append({"query": query, "pairs": pairs})
    reference = {
        "about": "expected logits and sigmoid scores of tests/data/tiny-reranker, made by "
        "scripts/gen-reranker-fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_length": MAX_LENGTH,
        "activation": "sigmoid",
        "queries": groups,
    }
    with open(args.reference, "w") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    sizes = {n: os.path.getsize(os.path.join(args.out, n)) for n in sorted(os.listdir(args.out))}
    print(f"wrote {args.out}: {sizes}; {args.reference}")
    for g in groups:
        print(g["query"][:40], [round(p["logit"], 4) for p in g["pairs"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
