"""streamfuse.Tensor against NumPy: operators, methods, laziness, conversions, and
every kind of bad input as a Python exception (never an abort)."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import streamfuse
from streamfuse import DTypeError, Tensor
from conftest import same_bits

rng = np.random.default_rng(7)


def arr(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv"])
def test_elementwise_operators_equal_numpy_bit_for_bit(op):
    import operator

    f = getattr(operator, op)
    a, b, row = arr(3, 5), arr(3, 5) + 3, arr(1, 5) + 3
    ta, tb, trow = Tensor.from_numpy(a), Tensor.from_numpy(b), Tensor.from_numpy(row)
    assert same_bits(f(ta, tb).numpy(), f(a, b))
    assert same_bits(f(ta, trow).numpy(), f(a, row))  # broadcast
    assert same_bits(f(ta, 3.0).numpy(), f(a, np.float32(3.0)))  # scalar right
    assert same_bits(f(2.5, ta).numpy(), f(np.float32(2.5), a))  # scalar left
    assert same_bits(f(ta, b).numpy(), f(a, b))  # NumPy operand
    assert same_bits(f(a, tb).numpy(), f(a, b))  # NumPy operand on the left


def test_matmul_and_neg_against_numpy():
    a, b = arr(4, 6), arr(6, 3)
    got = (Tensor.from_numpy(a) @ Tensor.from_numpy(b)).numpy()
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    batched = arr(2, 4, 6)
    np.testing.assert_allclose((Tensor.from_numpy(batched) @ b).numpy(), batched @ b, rtol=1e-5, atol=1e-5)
    assert same_bits((-Tensor.from_numpy(a)).numpy(), -a)
    assert same_bits(abs(Tensor.from_numpy(a)).numpy(), np.abs(a))


@pytest.mark.parametrize("name,ref,tol", [
    ("exp", np.exp, 1e-6), ("tanh", np.tanh, 1e-6), ("relu", lambda x: np.maximum(x, 0), 0),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), 1e-6), ("sqrt", lambda x: np.sqrt(np.abs(x)), 0),
    ("log", lambda x: np.log(np.abs(x)), 1e-6), ("recip", lambda x: 1 / x, 0),
])
def test_unary_methods_against_numpy(name, ref, tol):
    a = arr(4, 33)
    x = np.abs(a) if name in ("sqrt", "log") else a
    got = getattr(Tensor.from_numpy(x), name)().numpy()
    np.testing.assert_allclose(got, ref(a).astype(np.float32), rtol=tol, atol=tol)


def test_reductions_views_and_norms_against_numpy():
    a = arr(3, 4, 5)
    t = Tensor.from_numpy(a)
    np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.mean(-1, keepdim=True).numpy(), a.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert same_bits(t.max(0).numpy(), a.max(0))
    assert np.array_equal(t.argmax(2).numpy(), a.argmax(2).astype(np.uint32))
    np.testing.assert_allclose(t.cumsum(1).numpy(), a.cumsum(1), rtol=1e-5, atol=1e-5)
    lengths = np.array([3, 1, 2], dtype=np.uint32)
    assert np.array_equal(Tensor.from_numpy(lengths).cumsum(0).numpy(), lengths.cumsum(0))
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(t.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert same_bits(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    assert same_bits(t.permute([1, 0, 2]).numpy(), a.transpose(1, 0, 2))
    assert same_bits(t.reshape([12, 5]).numpy(), a.reshape(12, 5))
    assert same_bits(t.narrow(1, 1, 2).numpy(), a[:, 1:3])
    assert same_bits(t.unsqueeze(0).squeeze(0).numpy(), a)
    assert same_bits(Tensor.cat([t, t], 1).numpy(), np.concatenate([a, a], 1))
    idx = Tensor.from_numpy(np.array([2, 0], dtype=np.int64))
    assert same_bits(t.index_select(idx, 0).numpy(), a[[2, 0]])
    w, b = arr(5), arr(5)
    mu, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    np.testing.assert_allclose(t.layer_norm(Tensor.from_numpy(w), Tensor.from_numpy(b), 1e-5).numpy(),
                               (a - mu) / np.sqrt(var + 1e-5) * w + b, rtol=1e-4, atol=1e-5)
    assert np.asarray(t).shape == (3, 4, 5)


def test_ops_are_lazy_until_read():
    a = Tensor.from_numpy(arr(8, 8))
    b = (a + 1.0).gelu() * a
    assert not b.is_ready and "pending" in repr(b)
    out = b.numpy()
    assert b.is_ready and out.shape == (8, 8)
    before = streamfuse.stats()
    c = a.exp()
    streamfuse.sync()
    assert c.is_ready and streamfuse.stats()["segments"] > before["segments"]


def test_the_load_cap_switches_and_never_changes_results():
    a = Tensor.from_numpy(arr(256, 384))
    w = Tensor.from_numpy(arr(384, 384))
    assert streamfuse.load_aware()
    capped = (a @ w).gelu().numpy()
    s = streamfuse.stats()
    assert 1 <= s["kernel_threads_allowed"] <= s["kernel_threads"]
    streamfuse.set_load_aware(False)
    try:
        assert not streamfuse.load_aware()
        assert same_bits((a @ w).gelu().numpy(), capped)
        s = streamfuse.stats()
        assert s["kernel_threads_allowed"] == s["kernel_threads"]
    finally:
        streamfuse.set_load_aware(True)
    assert streamfuse.load_aware()


def test_from_numpy_copies_any_strides_and_zero_size_and_nan():
    a = arr(6, 8)
    for view in (a[:, ::2], a.T, np.asfortranarray(a), a[::-1]):
        assert same_bits(Tensor.from_numpy(view).numpy(), np.ascontiguousarray(view))
    # Strided views are copied and stay writable; with copy=True so is the array.
    view = a[:, ::2]
    Tensor.from_numpy(view)
    assert view.flags.writeable and a.flags.writeable
    t = Tensor.from_numpy(a, copy=True)
    a[0, 0] = 100.0
    assert t.numpy()[0, 0] != 100.0
    z = Tensor.from_numpy(np.zeros((0, 3), np.float32))
    assert z.shape == (0, 3) and z.numpy().shape == (0, 3)
    assert (z + 1.0).numpy().shape == (0, 3)
    n = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    got = (Tensor.from_numpy(n) * 2.0).numpy()
    assert np.isnan(got[1]) and got[2] == np.inf and got[3] == -np.inf and got[0] == 2.0
    assert Tensor.from_numpy(np.arange(4, dtype=np.uint32)).dtype == "uint32"
    assert np.array_equal(Tensor.from_numpy(np.arange(4, dtype=np.int64)).numpy(), np.arange(4))


def test_from_numpy_reads_an_owning_contiguous_array_in_place():
    # 64 MB: a copy would show in the engine's live bytes; reading in place adds none.
    a = rng.standard_normal((4096, 4096)).astype(np.float32)
    before = streamfuse.stats()["live_bytes"]
    t = Tensor.from_numpy(a)
    assert streamfuse.stats()["live_bytes"] - before < 1 << 20
    # The array is now read-only: the engine reads it lazily, a write would race.
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    s = (t * 2.0).narrow(0, 0, 2)
    expect = a[:2] * 2.0
    del a, t  # the pending op keeps the array alive
    import gc
    gc.collect()
    assert same_bits(s.numpy(), expect)
    # An operator's array operand is copied and stays writable; so is a view of
    # another array's memory.
    b = arr(3, 3)
    (Tensor.from_numpy(arr(3, 3)) + b).numpy()
    assert b.flags.writeable
    c = np.arange(12, dtype=np.int64)[2:8]
    assert np.array_equal(Tensor.from_numpy(c).numpy(), c) and c.flags.writeable
    u = np.arange(6, dtype=np.uint32).reshape(2, 3).copy()
    assert np.array_equal((Tensor.from_numpy(u) + Tensor.from_numpy(u)).numpy(), u + u)
    assert not u.flags.writeable


@pytest.mark.parametrize("bad", [
    np.zeros(3, np.float64), np.zeros(3, np.int32), np.zeros(3, bool), np.zeros(3, np.float16),
    np.zeros(3, ">f4"), np.array(["a"], object),
])
def test_unsupported_dtypes_are_dtype_errors(bad):
    with pytest.raises(DTypeError, match="not supported") as e:
        Tensor.from_numpy(bad)
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)
    with pytest.raises(DTypeError):
        Tensor.from_numpy(arr(3)) + bad


def test_engine_errors_keep_the_engine_message():
    a, b = Tensor.from_numpy(arr(3, 4)), Tensor.from_numpy(arr(5, 4))
    with pytest.raises(ValueError, match="add"):
        a + b
    with pytest.raises(ValueError, match="matmul"):
        a @ a
    with pytest.raises(ValueError, match="dim 5 is out of range"):
        a.sum(5)
    with pytest.raises(ValueError, match="narrow"):
        a.narrow(0, 2, 5)
    with pytest.raises(DTypeError):
        Tensor.from_numpy(np.arange(3, dtype=np.uint32)).exp()
    with pytest.raises(DTypeError, match="unknown dtype"):
        Tensor.zeros([2], "float64")
    with pytest.raises(TypeError, match="numpy.ndarray"):
        Tensor.from_numpy([1.0, 2.0])
    with pytest.raises(TypeError):
        a + "x"


def test_huge_shapes_are_memory_or_value_errors_not_aborts():
    with pytest.raises(MemoryError, match="out of memory"):
        Tensor.zeros([1 << 42]).numpy()
    with pytest.raises(ValueError):
        Tensor.zeros([1 << 40, 1 << 40])
    # The stream is still usable afterwards.
    assert same_bits((Tensor.from_numpy(np.ones(2, np.float32)) + 1.0).numpy(), np.full(2, 2, np.float32))


def test_threads_that_end_with_work_pending():
    out = []

    def work(i):
        a = Tensor.from_numpy(np.full((16, 16), i, np.float32))
        out.append((i, (a * 2.0 + 1.0).exp().sum(1)))  # queued, never read here

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, t in out:
        want = np.exp(np.full((16, 16), i, np.float32) * 2 + 1).sum(1)
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-5)


def test_stats_and_trace(tmp_path):
    s = streamfuse.stats()
    assert {"live_bytes", "peak_bytes", "segments", "plan_cache"} <= set(s)
    assert {"hits", "misses", "instantiated"} <= set(s["plan_cache"])
    path = tmp_path / "run.json"
    streamfuse.trace.start(path)
    with pytest.raises(RuntimeError, match="recording"):
        streamfuse.trace.start(tmp_path / "other.json")
    (Tensor.from_numpy(arr(4, 4)) + 1.0).numpy()
    written, events = streamfuse.trace.stop()
    assert written == str(path) and events > 0
    assert json.loads(path.read_text())
    with pytest.raises(RuntimeError):
        streamfuse.trace.stop()
    with pytest.raises(OSError):
        streamfuse.trace.start(tmp_path / "no" / "such" / "dir.json")


def test_log_records_reach_python_logging():
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=1, stream=sys.stdout, format='%(name)s|%(message)s')\n"
        "import numpy as np, streamfuse\n"
        "(streamfuse.Tensor.from_numpy(np.ones(4, np.float32)) + 1.0).numpy()\n"
        "print('--- trace on')\n"
        "streamfuse.set_log_level('trace')\n"
        "(streamfuse.Tensor.from_numpy(np.ones(4, np.float32)) + 2.0).numpy()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # Exits cleanly: records made at exit (tensors freed then) are not sent to a
    # logging module that is being torn down.
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    before, after = out.stdout.split("--- trace on\n")
    # Debug and trace narration is off by default, on after set_log_level.
    assert not [l for l in before.splitlines() if l.startswith("streamfuse")], before[-2000:]
    assert [l for l in after.splitlines() if l.startswith("streamfuse")], after[-2000:]
    with pytest.raises(ValueError, match="unknown log level"):
        streamfuse.set_log_level("loud")
