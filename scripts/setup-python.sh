#!/usr/bin/env bash
# Creates (or reuses) a Python virtual environment under target/ with what the
# reference scripts need: numpy, and the tokenizers package for token ids, and any
# further packages named on the command line (torch and transformers for
# scripts/gen-reranker-fixture.py: a large download, so best in a venv of its own).
#
#   scripts/setup-python.sh            -> prints the venv's python path on stdout
#   VENV=target/other scripts/setup-python.sh
#   VENV=target/pyref-torch scripts/setup-python.sh torch transformers
#
# Not used by CI: the references it produces (tests/data/minilm_reference.tsv,
# tests/data/tiny-reranker*) are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-target/pyref}"
if ! command -v python3 >/dev/null; then
    echo "python3 is needed to build the reference (install Python 3 with pip)" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtual environment $VENV" >&2
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import numpy, tokenizers" 2>/dev/null; then
    echo "installing numpy and tokenizers into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check numpy tokenizers >&2
fi
for pkg in "$@"; do
    if ! "$VENV/bin/python" -c "import $pkg" 2>/dev/null; then
        echo "installing $pkg into $VENV" >&2
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$pkg" >&2
    fi
done
echo "$VENV/bin/python"
