"""Writes sentence-transformers' vector for the empty text, the reference of
tests/test_embedder.py's empty-text test (run once, in a venv with
sentence-transformers such as scripts/compare-python.sh's):

    python empty_text_reference.py MODEL_DIR ../tests/data/st-empty-text.json
"""

import json
import sys
from importlib import metadata

from sentence_transformers import SentenceTransformer

model = SentenceTransformer(sys.argv[1], device="cpu")
v = model.encode([""])[0]
with open(sys.argv[2], "w") as f:
    json.dump({
        "text": "",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "made_by": f"sentence-transformers {metadata.version('sentence-transformers')}, "
                   f"torch {metadata.version('torch')}",
        "vector": [float(x) for x in v],
    }, f)
    f.write("\n")
