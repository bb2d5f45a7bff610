"""streamfuse.Embedder against the Rust Embedder (bit for bit), its
sentence-transformers-style arguments, its errors, and many Python threads at once."""

import json
import os
import threading

import numpy as np
import pytest

import streamfuse
from conftest import same_bits


def test_encode_equals_the_rust_embedder_bit_for_bit(embedder, sentences, rust_embeddings):
    got = embedder.encode(sentences)
    assert got.dtype == np.float32 and got.shape == (len(sentences), embedder.dim)
    assert got.flags["C_CONTIGUOUS"]
    assert same_bits(got, rust_embeddings)


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_the_vectors_do_not_depend_on_batch_size(embedder, sentences, rust_embeddings, batch_size):
    assert same_bits(embedder.encode(sentences[:20], batch_size=batch_size), rust_embeddings[:20])


def test_one_string_gives_one_vector_and_an_empty_list_none(embedder, sentences, rust_embeddings):
    v = embedder.encode(sentences[3])
    assert v.shape == (embedder.dim,) and same_bits(v, rust_embeddings[3])
    assert embedder.get_sentence_embedding_dimension() == embedder.dim == 384
    empty = embedder.encode([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32
    # Any sequence of strings, not only lists.
    assert same_bits(embedder.encode(tuple(sentences[:2])), rust_embeddings[:2])


def test_vectors_are_unit_length_and_normalize_false_follows_the_folder(embedder, sentences, tmp_path, model_dir):
    v = embedder.encode(sentences[:4])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # all-MiniLM-L6-v2 has a Normalize module: sentence-transformers normalises
    # whatever normalize_embeddings says, and so does encode.
    assert same_bits(embedder.encode(sentences[:4], normalize_embeddings=False), v)
    # A folder without one: the pooled vectors as they are unless asked, as
    # sentence-transformers returns them, and normalised when asked.
    folder = _copy_folder(model_dir, tmp_path, modules=[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ])
    e = streamfuse.Embedder(folder, workers=1)
    raw = e.encode(sentences[:4])
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), v, atol=1e-6)
    assert same_bits(e.encode(sentences[:4], normalize_embeddings=True), v)


def _copy_folder(model_dir, tmp_path, modules=None, st_config=None, name="model"):
    """A folder of links to the model's files, with modules.json or
    config_sentence_transformers.json replaced."""
    out = tmp_path / name
    out.mkdir()
    for name in os.listdir(model_dir):
        if name not in ("modules.json", "config_sentence_transformers.json"):
            os.symlink(os.path.join(model_dir, name), out / name)
    modules = modules if modules is not None else json.load(open(os.path.join(model_dir, "modules.json")))
    (out / "modules.json").write_text(json.dumps(modules))
    if st_config is not None:
        (out / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return str(out)


def test_prompts_come_from_the_folder_and_unknown_names_are_refused(model_dir, tmp_path, embedder):
    folder = _copy_folder(model_dir, tmp_path, st_config={
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt_name": None,
    })
    e = streamfuse.Embedder(folder, workers=1)
    assert e.prompts == {"query": "query: ", "passage": "passage: "}
    with_prompt = e.encode(["a cat", "a dog"], prompt_name="query")
    assert same_bits(with_prompt, embedder.encode(["query: a cat", "query: a dog"]))
    # An explicit prompt wins over prompt_name, as in sentence-transformers.
    assert same_bits(e.encode("a cat", prompt="passage: ", prompt_name="query"),
                     embedder.encode("passage: a cat"))
    with pytest.raises(ValueError, match=r"Prompt name 'qeury' not found .*\['query', 'passage'\]"):
        e.encode("a cat", prompt_name="qeury")
    # default_prompt_name applies when no prompt is given.
    d = _copy_folder(model_dir, tmp_path, name="default", st_config={
        "prompts": {"query": "query: "}, "default_prompt_name": "query"})
    assert same_bits(streamfuse.Embedder(d, workers=1).encode("a cat"), embedder.encode("query: a cat"))


def test_the_progress_bar_is_drawn_only_when_asked(embedder, sentences, capfd, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    embedder.encode(sentences[:10], batch_size=4)
    assert capfd.readouterr().err == ""
    embedder.encode(sentences[:10], batch_size=4, show_progress_bar=True)
    err = capfd.readouterr().err
    assert "Batches: 10/10" in err and err.endswith("\n"), err


def test_an_empty_text_is_cls_sep_as_in_sentence_transformers(embedder, sentences):
    cls_sep = embedder.tokenize("")
    assert len(cls_sep) == 2 and embedder.tokenize(" \t\n ") == cls_sep
    got = embedder.encode(["", sentences[0], "   ", "b"], batch_size=3)
    assert np.isfinite(got).all() and abs(float(np.linalg.norm(got[0])) - 1) < 1e-6
    assert same_bits(got[0], got[2]) and same_bits(got[0], embedder.encode(""))
    assert same_bits(got[1], embedder.encode(sentences[0]))
    # sentence-transformers' vector for "" with all-MiniLM-L6-v2 (the one model the
    # suite runs), written by bindings/python/bench/empty_text_reference.py.
    with open(os.path.join(os.path.dirname(__file__), "data", "st-empty-text.json")) as f:
        ref = np.array(json.load(f)["vector"], dtype=np.float64)
    cos = float(got[0].astype(np.float64) @ ref) / float(np.linalg.norm(ref))
    assert cos >= 0.99999, cos


def test_bad_texts_and_settings_are_value_errors(embedder, model_dir, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        embedder.encode(["a"], batch_size=0)
    with pytest.raises(TypeError):
        embedder.encode(["a", 3])
    with pytest.raises(ValueError, match="not a folder"):
        streamfuse.Embedder(tmp_path / "nothing")
    with pytest.raises(ValueError, match="unknown precision `f64`"):
        streamfuse.Embedder(model_dir, precision="f64")
    with pytest.raises(ValueError, match="workers must be at least 1"):
        streamfuse.Embedder(model_dir, workers=0)
    with pytest.raises(ValueError, match="max_batch_tokens 16 is below"):
        streamfuse.Embedder(model_dir, max_batch_tokens=16)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        streamfuse.Embedder(tmp_path / "broken")


def test_long_texts_are_truncated_not_refused(embedder):
    long = "word " * 2000
    v = embedder.encode(long)
    assert v.shape == (384,) and np.isfinite(v).all()
    assert len(embedder.tokenize(long)) == embedder.max_seq_length == 256


def test_eight_threads_at_once_equal_one_thread(embedder, sentences):
    want = embedder.encode(sentences)
    results = [None] * 8
    errors = []
    barrier = threading.Barrier(8)

    def run(i):
        try:
            barrier.wait()
            # Each thread its own slice order, so batches mix the threads' texts.
            results[i] = embedder.encode(sentences[i:] + sentences[:i], batch_size=8 + i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, got in enumerate(results):
        assert same_bits(got, np.concatenate([want[i:], want[:i]])), f"thread {i}"
