"""streamfuse.Reranker against the Rust Reranker (bit for bit) and transformers'
scores of the tiny fixture, in CrossEncoder.predict/rank's shapes."""

import numpy as np
import pytest

import streamfuse
from conftest import same_bits


@pytest.fixture(scope="module")
def reranker(reranker_dir):
    return streamfuse.Reranker(reranker_dir, workers=2)


def test_predict_equals_the_rust_reranker_and_transformers(reranker, ref_dir, reranker_reference):
    pairs = [(q, d) for q, d, _, _ in reranker_reference]
    scores = reranker.predict(pairs)
    logits = reranker.predict(pairs, return_logits=True, batch_size=3)
    assert scores.dtype == np.float32 and scores.shape == (len(pairs),)
    assert same_bits(scores, np.fromfile(ref_dir / "scores.f32", dtype="<f4"))
    assert same_bits(logits, np.fromfile(ref_dir / "logits.f32", dtype="<f4"))
    want = np.array([s for _, _, _, s in reranker_reference])
    assert np.abs(scores - want).max() < 1e-5
    one = reranker.predict(pairs[0])
    assert np.ndim(one) == 0 and one == scores[0]


def test_rank_sorts_by_score_as_cross_encoder_rank(reranker, reranker_reference):
    query = reranker_reference[0][0]
    docs = [d for q, d, _, _ in reranker_reference if q == query]
    ranked = reranker.rank(query, docs, return_documents=True)
    scores = reranker.predict([(query, d) for d in docs])
    assert [r["corpus_id"] for r in ranked] == sorted(range(len(docs)), key=lambda i: -scores[i])
    assert all(r["text"] == docs[r["corpus_id"]] for r in ranked)
    assert len(reranker.rank(query, docs, top_k=1)) == 1 and "text" not in reranker.rank(query, docs)[0]


def test_bad_pairs_are_value_errors(reranker):
    with pytest.raises(ValueError, match="pair 1: the query is empty"):
        reranker.predict([("q", "d"), (" ", "d")])
    with pytest.raises(ValueError, match="pair 0 has 3 texts"):
        reranker.predict([("q", "d", "e")])
    with pytest.raises(ValueError, match="not a folder"):
        streamfuse.Reranker("/no/such/folder")
    # Longer than the model's 64 tokens: cut, as CrossEncoder does.
    assert np.isfinite(reranker.predict(("q " * 100, "d " * 100)))
