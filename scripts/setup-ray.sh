#!/usr/bin/env bash
# The Python environment of examples/python/ray_embed.py (not in CI: Ray is a large
# download): a venv (default target/ray/venv) with ray[data] and pyarrow from PyPI and
# streamfuse built by `maturin build --release` and installed into it. Prints the
# venv's python on stdout.
#
#   scripts/setup-ray.sh                 -> target/ray/venv/bin/python
#   VENV=/some/where scripts/setup-ray.sh
#
# On a multi-node cluster every node needs the same environment (run this on each,
# or install ray[data], pyarrow and the wheel from target/ray/wheels there).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(realpath -m "${VENV:-target/ray/venv}")
WHEELS=$(dirname "$VENV")/wheels
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtual environment $VENV" >&2
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import ray.data, pyarrow, maturin" 2>/dev/null; then
    echo "installing ray[data], pyarrow and maturin into $VENV (large download)" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "ray[data]" pyarrow \
        maturin >&2
fi
echo "building streamfuse (maturin build --release) into $WHEELS" >&2
rm -rf "$WHEELS"
(cd bindings/python && "$VENV/bin/maturin" build --release --quiet -o "$WHEELS" >&2)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
    "$WHEELS"/streamfuse-*.whl >&2
echo "$VENV/bin/python"
