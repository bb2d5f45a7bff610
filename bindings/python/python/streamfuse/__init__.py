"""streamfuse: lazy, fused, memory-planned tensor programs on the CPU, from Python.

- :class:`Embedder` embeds texts with a sentence-transformers model folder
  (``encode`` as sentence-transformers' ``SentenceTransformer.encode``), and
  :class:`Reranker` scores (query, document) pairs with a CrossEncoder folder
  (``predict`` and ``rank``). Both run on worker threads of their own, with the GIL
  released for the whole forward pass: any number of Python threads can call one
  instance at once, sharing one copy of the weights.
- :class:`Tensor` drives the engine directly: lazy ops, ``+ - * / @``, ``numpy()``.
- :func:`stats`, :func:`sync`, :mod:`streamfuse.trace`; the engine's log records go
  to Python's :mod:`logging` under the ``streamfuse`` logger (``info`` and up;
  :func:`set_log_level` lets ``debug`` or ``trace`` through).

Errors: bad arguments (shapes, dims, values, texts, settings, model folders) raise
``ValueError`` (dtype problems :class:`DTypeError`, which is also a ``TypeError``);
memory the system refuses raises ``MemoryError``; anything else ``RuntimeError``.
The message is the engine's.
"""

from ._streamfuse import (
    DTypeError,
    Tensor,
    cpu_tier,
    load_aware,
    set_fusion,
    set_kernel_threads,
    set_load_aware,
    set_log_level,
    stats,
    sync,
)
from . import trace
from .models import Embedder, Reranker

import atexit as _atexit

# Log records made while the interpreter shuts down (tensors and streams freed at
# exit) must not reach `logging`, which is going away: the bridge goes quiet first.
_atexit.register(set_log_level, "off")

__all__ = [
    "DTypeError",
    "Embedder",
    "Reranker",
    "Tensor",
    "cpu_tier",
    "load_aware",
    "set_fusion",
    "set_kernel_threads",
    "set_load_aware",
    "set_log_level",
    "stats",
    "sync",
    "trace",
]
