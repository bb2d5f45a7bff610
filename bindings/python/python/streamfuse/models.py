"""``Embedder`` and ``Reranker``: sentence-transformers' ``SentenceTransformer.encode``
and ``CrossEncoder.predict``/``rank`` over streamfuse's Rust embedder and reranker.

One instance holds one copy of the weights and a set of worker threads (each with
its own engine stream); a call copies its texts, releases the GIL, queues them in
chunks of ``batch_size`` and waits, so any number of Python threads may call the
same instance at once and run in parallel. Texts longer than the model's
``max_seq_length`` are truncated, as sentence-transformers does.
"""

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _progress
from ._streamfuse import _Embedder, _Reranker

__all__ = ["Embedder", "Reranker"]

PathLike = Union[str, "os.PathLike[str]"]


def _json(path: str) -> Any:
    """The JSON file at ``path``, or ``None`` when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _modules(folder: str) -> List[Dict[str, Any]]:
    """The folder's modules.json entries (empty when it has none)."""
    modules = _json(os.path.join(folder, "modules.json"))
    return modules if isinstance(modules, list) else []


class _Model:
    """What :class:`Embedder` and :class:`Reranker` share: the folder and the native
    half, loaded with the constructor's settings."""

    _NATIVE: Any = None

    def __init__(
        self,
        path: PathLike,
        precision: str = "f32",
        workers: Optional[int] = None,
        max_batch_tokens: int = 2048,
        kernel_threads: int = 0,
    ) -> None:
        self.path = os.fspath(path)
        self._native = self._NATIVE(
            self.path, (precision, workers, max_batch_tokens, kernel_threads)
        )
        self._read_folder()

    def _read_folder(self) -> None:
        """Reads what the Python half needs from the folder (nothing here)."""


class Embedder(_Model):
    """Sentence embeddings from a sentence-transformers model folder (BERT encoders
    such as all-MiniLM-L6-v2: config.json, model.safetensors, tokenizer.json, and the
    pooling, sentence_bert_config.json, modules.json and
    config_sentence_transformers.json files when present).

    Args:
        path: the model folder.
        precision: the matrix weights' precision: ``"f32"`` (the reference),
            ``"bf16"``, ``"int8"`` or ``"bf16x3"`` (see the Rust ``Precision`` for the
            accuracy each keeps).
        workers: worker threads, each running batches on its own stream (default: one
            per core).
        max_batch_tokens: the most tokens one batch holds, summed over its texts (at
            least the model's ``max_seq_length``).
        kernel_threads: threads each worker's kernels run on (0, the default: the
            cores shared between the workers).

    Vectors are L2-normalised when the folder's modules end with ``Normalize`` or
    ``encode``'s ``normalize_embeddings`` asks, as in sentence-transformers.
    """

    _NATIVE = _Embedder

    def _read_folder(self) -> None:
        """The prompts, and whether the folder normalises and pools its prompt."""
        config = _json(os.path.join(self.path, "config_sentence_transformers.json")) or {}
        #: The folder's prompts (config_sentence_transformers.json), by name.
        self.prompts: Dict[str, str] = dict(config.get("prompts") or {})
        #: The prompt used when ``encode`` is given none (``None``: no prompt).
        self.default_prompt_name: Optional[str] = config.get("default_prompt_name")
        modules = _modules(self.path)
        self._normalizes = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
        self._pooling_includes_prompt = self._include_prompt(modules)

    def _include_prompt(self, modules: List[Dict[str, Any]]) -> bool:
        """The pooling config's ``include_prompt`` (true when absent)."""
        sub = next(
            (m.get("path") for m in modules if str(m.get("type", "")).endswith("Pooling")),
            "1_Pooling",
        )
        pooling = _json(os.path.join(self.path, sub or "1_Pooling", "config.json")) or {}
        return bool(pooling.get("include_prompt", True))

    @property
    def dim(self) -> int:
        """The width of the vectors (384 for all-MiniLM-L6-v2)."""
        return self._native.dim

    def get_sentence_embedding_dimension(self) -> int:
        """The width of the vectors (sentence-transformers' name)."""
        return self._native.dim

    @property
    def max_seq_length(self) -> int:
        """The most tokens a text keeps, special tokens included; longer texts are
        truncated."""
        return self._native.max_tokens

    def tokenize(self, text: str) -> List[int]:
        """The token ids the model runs for ``text`` (special tokens included, after
        truncation)."""
        return self._native.tokenize(text)

    def _prompt(self, prompt_name: Optional[str], prompt: Optional[str]) -> Optional[str]:
        """The prompt to prepend, by sentence-transformers' rule: an explicit
        ``prompt`` wins, then ``prompt_name`` (which must be one of ``prompts``), then
        ``default_prompt_name``."""
        if prompt is not None:
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(
                    f"Prompt name {prompt_name!r} not found in the configured prompts "
                    f"dictionary with keys {list(self.prompts)!r} "
                    f"(config_sentence_transformers.json of {self.path})"
                )
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name)
        return None

    def encode(
        self,
        sentences: Union[str, Sequence[str]],
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        show_progress_bar: bool = False,
    ) -> np.ndarray:
        """Embeds ``sentences``: a float32 array ``(len(sentences), dim)``, or
        ``(dim,)`` for one string, as sentence-transformers' ``encode`` with its
        defaults (``convert_to_numpy=True``) returns.

        Args:
            sentences: a string or a sequence of strings.
            batch_size: texts per chunk handed to the workers; all chunks are queued
                at once, and the workers batch them by tokens
                (``max_batch_tokens``). The vectors do not depend on it.
            normalize_embeddings: L2-normalise the vectors. A folder whose modules.json
                ends with a ``Normalize`` module (all-MiniLM-L6-v2's does) normalises
                them whatever this says, as sentence-transformers does; for any other
                folder ``False`` (the default, as sentence-transformers') returns the
                vectors its pooling (and Dense layers) make.
            prompt_name: a key of the folder's ``prompts``
                (config_sentence_transformers.json); its text is prepended to every
                sentence. An unknown name raises ``ValueError`` naming the known ones.
                ``None`` uses ``default_prompt_name`` when the folder sets one.
            prompt: a prompt text to prepend (wins over ``prompt_name``).
            show_progress_bar: draw a bar (tqdm's when installed, else a line on
                stderr) as chunks come back.

        An empty list gives an array ``(0, dim)``. An empty or all-whitespace text is
        embedded as sentence-transformers embeds it: as the tokens ``[CLS] [SEP]``
        alone (the Rust ``Embedder::embed`` refuses such a text; the package sends
        the tokens through ``submit_tokens``).
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        text = self._prompt(prompt_name, prompt)
        if text:
            if not self._pooling_includes_prompt:
                raise ValueError(
                    "this folder's pooling excludes the prompt's tokens (include_prompt: "
                    "false), which streamfuse does not support"
                )
            texts = [text + t for t in texts]
        bar = _progress.bar(show_progress_bar, len(texts), "Batches")
        try:
            out = self._native.embed(
                texts, batch_size, _progress.callback(bar), normalize_embeddings
            )
        finally:
            if bar is not None:
                bar.close()
        return out[0] if single else out


Pair = Union[Tuple[str, str], List[str]]


class Reranker(_Model):
    """Relevance scores from a sentence-transformers CrossEncoder folder (a
    ``BertForSequenceClassification`` with one label, such as
    cross-encoder/ms-marco-MiniLM-L6-v2). Each (query, document) pair is one sequence
    ``[CLS] query [SEP] document [SEP]``, cut from its longer side to the model's
    length; its score is the logit through the folder's activation (sigmoid unless
    its config names another), as ``CrossEncoder.predict`` returns.

    Args: as :class:`Embedder`'s.
    """

    _NATIVE = _Reranker

    @property
    def max_length(self) -> int:
        """The most tokens a pair keeps, special tokens included."""
        return self._native.max_tokens

    def predict(
        self,
        sentences: Union[Pair, Sequence[Pair]],
        batch_size: int = 32,
        show_progress_bar: bool = False,
        return_logits: bool = False,
    ) -> Union[np.ndarray, np.float32]:
        """Scores of (query, document) pairs: a float32 array, one per pair, or one
        float32 for a single pair (as ``CrossEncoder.predict``). ``return_logits``
        gives the classifier's logits instead of the activated scores (a streamfuse
        argument; sentence-transformers passes ``activation_fn=Identity()``)."""
        single = len(sentences) > 0 and isinstance(sentences[0], str)
        pairs = [tuple(sentences)] if single else [tuple(p) for p in sentences]
        for i, p in enumerate(pairs):
            if len(p) != 2:
                raise ValueError(f"pair {i} has {len(p)} texts; a pair is (query, document)")
        bar = _progress.bar(show_progress_bar, len(pairs), "Batches")
        try:
            logits, scores = self._native.score_pairs(pairs, batch_size, _progress.callback(bar))
        finally:
            if bar is not None:
                bar.close()
        out = logits if return_logits else scores
        return out[0] if single else out

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: Optional[int] = None,
        return_documents: bool = False,
        batch_size: int = 32,
        show_progress_bar: bool = False,
    ) -> List[Dict[str, Any]]:
        """The documents ranked for ``query``, most relevant first, as
        ``CrossEncoder.rank`` returns them: ``[{"corpus_id": i, "score": s}, ...]``
        (with ``"text"`` when ``return_documents``), the first ``top_k`` only when
        given. Equal scores keep the documents' order."""
        scores = self.predict(
            [(query, d) for d in documents], batch_size, show_progress_bar
        )
        results: List[Dict[str, Any]] = []
        for i, s in enumerate(scores):
            r: Dict[str, Any] = {"corpus_id": i, "score": float(s)}
            if return_documents:
                r["text"] = documents[i]
            results.append(r)
        results.sort(key=lambda r: r["score"], reverse=True)
        return results[:top_k] if top_k is not None else results
