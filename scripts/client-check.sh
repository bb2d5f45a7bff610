#!/usr/bin/env bash
# The embeddings server (examples/serve.rs) against OpenAI's official Python client, as
# its users run it: `OpenAI(base_url=..., api_key=...)` with no other settings, so the
# client asks for base64 and decodes it with numpy. Prints one line per check, `ok` or
# `FAIL` with what differed, and exits non-zero when a check fails. Not part of CI
# (it installs the `openai` package from PyPI).
#
#   scripts/client-check.sh                  # builds and starts the server on a free port
#   URL=http://host:8080 scripts/client-check.sh   # checks a server already running
#
# Checks: GET /v1/models through the client; embeddings with the client's default
# (base64) and with encoding_format="float", equal to the last bit; one string and a
# list; `dimensions` (length, unit norm, the renormalised prefix of the full vector);
# token ids as input; a bad request is the client's BadRequestError naming the field;
# POST /v1/rerank through plain HTTP (urllib): sorted, top_n, return_documents, and the
# scores transformers computed for the reranker fixture (tests/data/tiny-reranker,
# served with --reranker), within 1e-5; Text Embeddings Inference's POST /embed (the
# same vectors as the client's) and GET /info; GET /metrics in Prometheus' text format.
# When it starts the server itself, it then starts a second one with --api-key and
# checks the client with that key (answered), with another key (the client's
# AuthenticationError) and /health without one.
#
# Installs under target/client-check/: a virtual environment with openai and numpy.
# STREAMFUSE_MODEL_DIR or target/models/all-MiniLM-L6-v2 is the model served;
# RERANKER (default tests/data/tiny-reranker) the reranker.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=target/client-check
venv=$dir/venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
fi
"$venv/bin/python" -c "import openai, numpy" 2>/dev/null ||
    "$venv/bin/pip" install --quiet openai numpy

url=${URL:-}
server=
if [ -z "$url" ]; then
    cargo build --quiet --release --example serve
    port=$("$venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    url=http://127.0.0.1:$port
    model=()
    [ -z "${STREAMFUSE_MODEL_DIR:-}" ] || model=(--model "$STREAMFUSE_MODEL_DIR")
    target/release/examples/serve --bind "127.0.0.1:$port" "${model[@]}" \
        --reranker "${RERANKER:-tests/data/tiny-reranker}" >"$dir/serve.log" 2>&1 &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT
    for _ in $(seq 600); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        kill -0 $server 2>/dev/null || { cat "$dir/serve.log"; exit 1; }
        sleep 0.1
    done
fi
echo "== server: $url (openai $("$venv/bin/python" -c 'import openai; print(openai.__version__)'))"

"$venv/bin/python" - "$url" <<'EOF'
import json
import sys
import urllib.error
import urllib.request

import numpy as np
import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="x")
failed = 0


def check(name, ok, detail=""):
    global failed
    failed += not ok
    print(f"{'ok' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail and not ok else ""))


# The embedding model, then the reranker when one is served.
models = client.models.list().data
check("models.list names the served models", len(models) in (1, 2), str(models))
name = models[0].id if models else "model"

texts = ["The cat sits outside", "A man is playing guitar", "Rust is a language"]
default = client.embeddings.create(model=name, input=texts)  # base64, the default
floats = client.embeddings.create(model=name, input=texts, encoding_format="float")
a = np.array([d.embedding for d in default.data], dtype=np.float32)
b = np.array([d.embedding for d in floats.data], dtype=np.float32)
check("default (base64) gives one vector per text", a.shape == (3, 384), str(a.shape))
check("base64 equals float to the last bit", a.tobytes() == b.tobytes(),
      f"max difference {np.abs(a - b).max()}")
check("vectors are unit length", np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5))
check("usage counts the tokens", default.usage.prompt_tokens > len(texts),
      str(default.usage))

one = client.embeddings.create(model=name, input=texts[0])
check("one string", np.array(one.data[0].embedding, dtype=np.float32).tobytes()
      == a[0].tobytes())

cut = client.embeddings.create(model=name, input=texts, dimensions=64)
c = np.array([d.embedding for d in cut.data], dtype=np.float32)
want = a[:, :64] / np.linalg.norm(a[:, :64], axis=1, keepdims=True)
check("dimensions=64: 64 values, the renormalised prefix",
      c.shape == (3, 64) and np.abs(c - want).max() < 1e-6,
      f"shape {c.shape}, max difference {np.abs(c - want).max() if c.shape == want.shape else '-'}")

# Token ids of the model's own vocabulary ([CLS] the cat ... [SEP] for MiniLM's).
ids = client.embeddings.create(model=name, input=[[101, 1996, 4937, 7719, 2648, 102]],
                               encoding_format="float")
check("token ids as input", len(ids.data[0].embedding) == 384)

for bad, field in [({"dimensions": 1000}, "dimensions"),
                   ({"input": [[101, 10**9]]}, "vocabulary")]:
    args = {"model": name, "input": texts} | bad
    try:
        client.embeddings.create(**args)
        check(f"{bad} is refused", False, "answered 200")
    except openai.BadRequestError as e:
        check(f"{bad} is a BadRequestError naming it", field in str(e), str(e))


# /v1/rerank through plain HTTP, as Cohere's and Jina's clients post it.
def rerank(body):
    req = urllib.request.Request(sys.argv[1] + "/v1/rerank", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


with open("tests/data/tiny-reranker-reference.json") as f:
    group = json.load(f)["queries"][0]
docs = [p["document"] for p in group["pairs"]]
status, body = rerank({"query": group["query"], "documents": docs})
if status == 404:
    print(f"skip  /v1/rerank: the server has no reranker ({body['error']['message']})")
else:
    results = body.get("results", [])
    got = [r["relevance_score"] for r in results]
    check("/v1/rerank answers every document, sorted", status == 200 and len(results) == len(docs)
          and got == sorted(got, reverse=True), f"{status} {body}")
    want = {i: p["score"] for i, p in enumerate(group["pairs"])}
    diff = max((abs(r["relevance_score"] - want[r["index"]]) for r in results), default=1)
    check("/v1/rerank scores are transformers' (fixture) within 1e-5", diff <= 1e-5,
          f"max difference {diff} (is the reranker tests/data/tiny-reranker?)")
    status, body = rerank({"query": group["query"], "documents": docs, "top_n": 2,
                           "return_documents": True})
    top = body.get("results", [])
    check("/v1/rerank top_n=2 with return_documents", status == 200 and len(top) == 2
          and all(r["document"]["text"] == docs[r["index"]] for r in top), str(body))
    status, body = rerank({"query": "", "documents": docs})
    check("/v1/rerank with an empty query is a 400 naming it",
          status == 400 and "query" in body["error"]["message"], f"{status} {body}")



def get(path, body=None):
    req = urllib.request.Request(sys.argv[1] + path, headers={"content-type": "application/json"},
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# Text Embeddings Inference's routes, as its clients post them.
status, _, body = get("/embed", {"inputs": texts})
tei = np.array(json.loads(body), dtype=np.float32) if status == 200 else None
check("TEI /embed gives the client's vectors to the last bit",
      tei is not None and tei.tobytes() == a.tobytes(), f"{status} {body[:200]}")
status, _, body = get("/info")
info = json.loads(body) if status == 200 else {}
check("TEI /info names the model and its limits",
      info.get("model_id") == name and info.get("max_input_length", 0) > 0
      and info.get("dimensions") == 384, f"{status} {info}")
status, headers, body = get("/metrics")
text = body.decode()
check("/metrics is Prometheus text with the request counter",
      status == 200 and headers.get("content-type", "").startswith("text/plain; version=0.0.4")
      and 'streamfuse_requests_total{route="/v1/embeddings",status="200"}' in text,
      f"{status} {text[:200]}")

sys.exit(1 if failed else 0)
EOF

# A second server with --api-key (through its variable): the client's api_key is the
# Bearer token.
if [ -n "$server" ]; then
    kill $server 2>/dev/null || true
    wait $server 2>/dev/null || true
    key=client-check-$RANDOM$RANDOM
    STREAMFUSE_API_KEY=$key target/release/examples/serve --bind "127.0.0.1:$port" \
        "${model[@]}" >"$dir/serve-key.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        kill -0 $server 2>/dev/null || { cat "$dir/serve-key.log"; exit 1; }
        sleep 0.1
    done
    "$venv/bin/python" - "$url" "$key" <<'EOF'
import sys
import urllib.request

import openai
from openai import OpenAI

url, key = sys.argv[1], sys.argv[2]
failed = 0


def check(name, ok, detail=""):
    global failed
    failed += not ok
    print(f"{'ok' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail and not ok else ""))


right = OpenAI(base_url=url + "/v1", api_key=key)
r = right.embeddings.create(model="m", input=["The cat sits outside"])
check("--api-key: the client with the key is answered", len(r.data) == 1)
try:
    OpenAI(base_url=url + "/v1", api_key=key + "x", max_retries=0).embeddings.create(
        model="m", input=["The cat sits outside"])
    check("--api-key: another key is refused", False, "answered 200")
except openai.AuthenticationError as e:
    check("--api-key: another key is the client's AuthenticationError (401)",
          e.status_code == 401 and key not in str(e), str(e))
with urllib.request.urlopen(url + "/health") as resp:
    check("--api-key: /health needs no key", resp.status == 200)
sys.exit(1 if failed else 0)
EOF
    if grep -q "$key" "$dir/serve-key.log"; then
        echo "FAIL  --api-key: the key appears in the server's log"
        exit 1
    fi
    echo "ok  --api-key: the key is not in the server's log"
fi
