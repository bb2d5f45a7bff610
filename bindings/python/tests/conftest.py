"""Fixtures shared by the tests: the reference outputs written by the Rust program
examples/python_reference.rs (run by scripts/test-python.sh before pytest), the model
folder it found or fetched, and the tiny reranker fixture of the Rust tests.

``STREAMFUSE_PY_REF`` names the reference folder (default: target/python-ref at the
repository root). It holds model.txt, sentences.txt, embeddings.f32, pairs.tsv,
logits.f32 and scores.f32.
"""

import json
import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def ref_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("STREAMFUSE_PY_REF", ROOT / "target" / "python-ref"))
    if not (d / "model.txt").is_file():
        pytest.fail(
            f"{d} has no reference outputs: run scripts/test-python.sh (it runs "
            "examples/python_reference.rs before pytest)"
        )
    return d


@pytest.fixture(scope="session")
def model_dir(ref_dir) -> str:
    return (ref_dir / "model.txt").read_text().strip()


@pytest.fixture(scope="session")
def sentences(ref_dir):
    return (ref_dir / "sentences.txt").read_text().splitlines()


@pytest.fixture(scope="session")
def rust_embeddings(ref_dir, sentences):
    v = np.fromfile(ref_dir / "embeddings.f32", dtype="<f4")
    return v.reshape(len(sentences), -1)


@pytest.fixture(scope="session")
def embedder(model_dir):
    import streamfuse

    return streamfuse.Embedder(model_dir)


@pytest.fixture(scope="session")
def reranker_dir() -> str:
    return str(ROOT / "tests" / "data" / "tiny-reranker")


@pytest.fixture(scope="session")
def reranker_reference():
    """The tiny reranker's (query, document, logit, score) as transformers gave them."""
    data = json.loads((ROOT / "tests" / "data" / "tiny-reranker-reference.json").read_text())
    return [
        (q["query"], p["document"], p["logit"], p["score"])
        for q in data["queries"]
        for p in q["pairs"]
    ]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float32 arrays have the same shape and the same bits everywhere."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(
        a.view(np.uint32), b.view(np.uint32)
    )
