#!/usr/bin/env python3
"""Makes the sentence-transformers pipeline fixtures: small random-initialised BERT
folders under tests/data/st-pipeline/<name>/, each with the embeddings
sentence-transformers itself computes for a few texts (tests/data/st-pipeline/<name>/
reference.json). CI does not run this: the files are committed, and the Rust tests
(tests/pipeline.rs) compare the Embedder against them. Run it by hand after changing
what a fixture holds:

    python3 -m venv target/fixtures/venv   # with torch importable (see below)
    target/fixtures/venv/bin/pip install transformers sentence-transformers
    target/fixtures/venv/bin/python scripts/make-fixtures.py [NAME ...]   (default: all)

(PyPI's default torch wheel pulls gigabytes of CUDA libraries; any CPU torch will
do, e.g. one already installed, made importable with a `.pth` file in the venv.)
Versions used for the committed files: torch 2.15.0, transformers 5.24.0,
sentence-transformers 6.2.0 (each reference.json records its own).

Each fixture is one BERT encoder (hidden 32, 2 layers, 4 heads, feed-forward 64, 64
positions, GELU; weights normal with standard deviation 0.3 and non-trivial biases and
layer-norm parameters, seeded, so a misplaced weight shows) with the tiny WordPiece
tokenizer of tests/data/tiny-reranker (284 tokens cut from all-MiniLM-L6-v2's; [CLS]
and [SEP] are ids 2 and 3, not BERT's 101 and 102), then the modules named:

- max:            Pooling(max)                        (classic modules.json)
- weightedmean:   Pooling(weightedmean)
- lasttoken:      Pooling(lasttoken)
- dense-tanh:     Pooling(mean), Dense(32 -> 16, Tanh) (classic modules.json)
- cls-normalize:  Pooling(cls), Normalize
- concat:         Pooling(cls, max, mean) concatenated, Normalize
- prompt:         Pooling(mean, include_prompt=False), Normalize, with prompts
                  `query` and `passage` and no default prompt
- xlm-roberta:    the encoder as XLM-RoBERTa (`model_type` xlm-roberta: position ids
                  from pad_token_id + 1 on, one token type, layer-norm eps 1e-5),
                  Pooling(mean), Normalize
- mpnet:          the encoder as MPNet (`model_type` mpnet: no token types, position
                  ids from 2 on, a relative position bias of 32 buckets per head shared
                  by the layers, 160 positions so distances past 128 share the last
                  bucket), Pooling(mean), Normalize, as all-mpnet-base-v2 has it. The
                  tokenizer's [PAD] and [UNK] swap ids, because Hugging Face's MPNet
                  takes id 1 as padding whatever the config says; the texts include
                  one longer than 128 tokens.
- modernbert:     a ModernBERT encoder (`model_type` modernbert: 3 layers, global
                  attention in layers 0 and 2 (rotary theta 160000), local attention
                  of +-8 tokens in layer 1 (`local_attention` 16, theta 10000), GeGLU,
                  layer norms without biases, 160 positions), Pooling(mean),
                  Normalize, as modernbert-embed has it; the texts include one of 140
                  tokens.
- qwen3:          a Qwen3 decoder (`model_type` qwen3: causal attention, 4 query heads
                  sharing 2 key/value heads of width 16 (so heads x head_dim is not
                  hidden_size), RMS norms, q/k norms, rotary positions with theta
                  1e6, SwiGLU, no biases), Pooling(lasttoken), Normalize, and the
                  instruction prompt `query` as Qwen3-Embedding's card writes it.

"classic" rewrites modules.json with the `sentence_transformers.models.X` type names of
sentence-transformers up to 5, and the pooling config with its one boolean key per
mode (both of which 6 still loads); the others keep the module paths
sentence-transformers 6 writes. The references are computed in float64 (the model cast
to double), one per (fixture, prompt name) case, for every text.
"""

import json
import os
import sys
import shutil
import tempfile

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertModel,
    ModernBertConfig,
    ModernBertModel,
    MPNetConfig,
    MPNetModel,
    Qwen3Config,
    Qwen3Model,
    XLMRobertaConfig,
    XLMRobertaModel,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "st-pipeline")
TOKENIZER = os.path.join(ROOT, "tests", "data", "tiny-reranker")

TEXTS = [
    "The cat sits outside",
    "A man is playing guitar",
    "hello",
    "The new movie is awesome, and the food at the party was great too",
    "Is the weather nice today? It might rain later in the evening.",
    "x",
    "Two dogs run across a green field while a child watches them from the porch",
]

CLASSIC = {
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Dense": "sentence_transformers.models.Dense",
    "Normalize": "sentence_transformers.models.Normalize",
}


def pad_is_one(tmp):
    """The tiny tokenizer with [PAD] as id 1 and [UNK] as id 0, saved to `tmp`."""
    os.makedirs(tmp, exist_ok=True)
    for f in os.listdir(TOKENIZER):
        if f.startswith("tokenizer") or f.startswith("special"):
            shutil.copy(os.path.join(TOKENIZER, f), tmp)
    path = os.path.join(tmp, "tokenizer.json")
    t = json.load(open(path))
    swap = {"[PAD]": 1, "[UNK]": 0}
    for name, i in swap.items():
        t["model"]["vocab"][name] = i
    for a in t["added_tokens"]:
        a["id"] = swap.get(a["content"], a["id"])
    t["added_tokens"].sort(key=lambda a: a["id"])
    json.dump(t, open(path, "w"))
    return AutoTokenizer.from_pretrained(tmp)


def encoder(seed, tmp, arch="bert"):
    """A random BERT (or XLM-RoBERTa, MPNet, ModernBERT or Qwen3: `arch`) with the tiny tokenizer, saved
    to `tmp` for Transformer()."""
    torch.manual_seed(seed)
    if arch == "mpnet":
        tok = pad_is_one(os.path.join(tmp, "tok"))
        assert tok.pad_token_id == 1 and tok.unk_token_id == 0
    else:
        tok = AutoTokenizer.from_pretrained(TOKENIZER)
    max_len = 64
    if arch == "modernbert":
        max_len = 160
        cfg = ModernBertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=max_len,
            local_attention=16,
            global_attn_every_n_layers=2,
            hidden_activation="gelu",
            norm_eps=1e-5,
            pad_token_id=tok.pad_token_id,
            cls_token_id=tok.cls_token_id,
            sep_token_id=tok.sep_token_id,
            bos_token_id=tok.cls_token_id,
            eos_token_id=tok.sep_token_id,
        )
        model = ModernBertModel(cfg)
    elif arch == "qwen3":
        cfg = Qwen3Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=max_len,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
        model = Qwen3Model(cfg)
    elif arch == "mpnet":
        max_len = 160
        cfg = MPNetConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=max_len + 2,
            relative_attention_num_buckets=32,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            pad_token_id=1,
        )
        model = MPNetModel(cfg, add_pooling_layer=False)
    elif arch == "xlm-roberta":
        # RoBERTa's position ids start past the padding id: 64 positions need
        # pad_token_id + 1 more rows. One token type, as XLM-RoBERTa has.
        cfg = XLMRobertaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64 + tok.pad_token_id + 1,
            type_vocab_size=1,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            pad_token_id=tok.pad_token_id,
        )
        model = XLMRobertaModel(cfg, add_pooling_layer=False)
    else:
        cfg = BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            type_vocab_size=2,
            hidden_act="gelu",
            pad_token_id=tok.pad_token_id,
        )
        model = BertModel(cfg, add_pooling_layer=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name or "layer_norm.weight" in name or "norm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif arch == "modernbert" and p.dim() == 2 and "embeddings" not in name:
                # Pre-norm with a GeGLU (a product of two projections): at 0.3 the
                # residual stream grows about 7x a layer, far more sensitive to a
                # weight's rounding than any trained model; 1/sqrt(fan-in) (the scale
                # of nn.Linear's own init) keeps the layers' gain near 1.
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return Transformer(tmp, max_seq_length=max_len)


def build(name, seed, modes, include_prompt=True, dense=False, normalize=False, prompts=None,
          arch="bert"):
    with tempfile.TemporaryDirectory() as tmp:
        word = encoder(seed, tmp, arch)
        modules = [word]
        pool = Pooling(32, pooling_mode=tuple(modes) if len(modes) > 1 else modes[0],
                       include_prompt=include_prompt)
        modules.append(pool)
        if dense:
            torch.manual_seed(seed + 1)
            d = Dense(32 * len(modes), 16, activation_function=torch.nn.Tanh())
            with torch.no_grad():
                d.linear.weight.copy_(0.3 * torch.randn_like(d.linear.weight))
                d.linear.bias.copy_(0.3 * torch.randn_like(d.linear.bias))
            modules.append(d)
        if normalize:
            modules.append(Normalize())
        st = SentenceTransformer(modules=modules, prompts=prompts or {}, device="cpu")
        path = os.path.join(OUT, name)
        shutil.rmtree(path, ignore_errors=True)
        st.save(path)
    return st, path


def classic(path):
    mods_path = os.path.join(path, "modules.json")
    mods = json.load(open(mods_path))
    for m in mods:
        m["type"] = CLASSIC[m["type"].rsplit(".", 1)[1]]
    json.dump(mods, open(mods_path, "w"), indent=2)
    # And the pooling config as it wrote it: one boolean key per mode.
    pool_path = os.path.join(path, "1_Pooling", "config.json")
    pool = json.load(open(pool_path))
    modes = pool.pop("pooling_mode")
    modes = [modes] if isinstance(modes, str) else modes
    keys = {
        "cls": "pooling_mode_cls_token",
        "max": "pooling_mode_max_tokens",
        "mean": "pooling_mode_mean_tokens",
        "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
        "weightedmean": "pooling_mode_weightedmean_tokens",
        "lasttoken": "pooling_mode_lasttoken",
    }
    legacy = {"word_embedding_dimension": pool.pop("embedding_dimension")}
    legacy.update({key: mode in modes for mode, key in keys.items()})
    legacy.update(pool)
    json.dump(legacy, open(pool_path, "w"), indent=2)


# Over 128 tokens, so that MPNet's farthest bucket is used.
LONG = " ".join(["the cat and the dog sit outside in the sun"] * 14)


def reference(st, path, prompt_names):
    # Reload as a user would, so the saved folder is what is measured.
    st = SentenceTransformer(path, device="cpu").double()
    texts = TEXTS + [LONG] if st.max_seq_length > 128 else TEXTS
    cases = []
    for prompt_name in prompt_names:
        emb = st.encode(texts, prompt_name=prompt_name, convert_to_numpy=True,
                        normalize_embeddings=False, batch_size=len(texts))
        cases.append({"prompt_name": prompt_name, "embeddings": emb.tolist()})
    ref = {
        "texts": texts,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
        },
        "dtype": str(next(st.parameters()).dtype),
        "cases": cases,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f)
    # The model card is large and says nothing the tests use.
    for junk in ["README.md"]:
        p = os.path.join(path, junk)
        if os.path.exists(p):
            os.remove(p)


def main():
    os.makedirs(OUT, exist_ok=True)
    specs = [
        ("max", 11, ["max"], {}, True),
        ("weightedmean", 12, ["weightedmean"], {}, False),
        ("lasttoken", 13, ["lasttoken"], {}, False),
        ("dense-tanh", 14, ["mean"], {"dense": True}, True),
        ("cls-normalize", 15, ["cls"], {"normalize": True}, False),
        ("concat", 16, ["cls", "max", "mean"], {"normalize": True}, False),
        (
            "prompt",
            17,
            ["mean"],
            {
                "include_prompt": False,
                "normalize": True,
                "prompts": {"query": "query: ", "passage": "passage: "},
            },
            False,
        ),
        ("xlm-roberta", 18, ["mean"], {"normalize": True, "arch": "xlm-roberta"}, False),
        ("mpnet", 19, ["mean"], {"normalize": True, "arch": "mpnet"}, False),
        ("modernbert", 21, ["mean"], {"normalize": True, "arch": "modernbert"}, False),
        (
            "qwen3",
            20,
            ["lasttoken"],
            {
                "normalize": True,
                "arch": "qwen3",
                "prompts": {
                    "query": "Instruct: Given a web search query, retrieve relevant "
                    "passages that answer the query\nQuery:"
                },
            },
            False,
        ),
    ]
    only = set(sys.argv[1:])
    for name, seed, modes, kw, is_classic in specs:
        if only and name not in only:
            continue
        st, path = build(name, seed, modes, **kw)
        if is_classic:
            classic(path)
        names = [None] + sorted((kw.get("prompts") or {}).keys())
        reference(st, path, names)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        print(f"{name}: {size // 1024} KiB")


if __name__ == "__main__":
    main()
