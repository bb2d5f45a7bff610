#!/usr/bin/env python3
"""Which instruction set each peer's library runs under the environment it is given:
the evidence compare-peers.sh --isa prints under its table that a cap took effect
(or that a peer ran uncapped).

    python isa_probe.py torch                     # under ATEN_CPU_CAPABILITY etc.
    python isa_probe.py numpy                     # under OPENBLAS_CORETYPE
    python isa_probe.py openvino --onnx FILE --model DIR [--threads 2]

torch: `torch.backends.cpu.get_cpu_capability()` (ATen's vector kernels), then an
f32 matrix product (MKL's sgemm) and a reorder into oneDNN's layout in a child process run
with MKL_VERBOSE=1 and ONEDNN_VERBOSE=1, of whose output it keeps MKL's banner (which
names the instruction set MKL dispatches to) and oneDNN's `isa` line.
numpy: the core type OpenBLAS picked (its get_corename).
openvino: compiles FILE for the CPU, runs one padded batch of two sentences, and prints
the inference precision and the runtime model's kernels by layer type (their names
carry the instruction set: brgemm_avx2, jit_avx512, ...).

Each prints one line `<peer>: <what it runs>`; it never fails the comparison (a probe
that cannot run says so in its line).
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_child():
    import torch

    print(f"capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    a = torch.randn(64, 64)
    torch.mm(a, a)
    # A reorder into oneDNN's layout and back: oneDNN's first primitive, after which
    # it prints its info lines (isa among them).
    a.to_mkldnn().to_dense()
    sys.stdout.flush()


def torch_probe():
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    try:
        text = subprocess.run([sys.executable, __file__, "torch-child"], env=env, text=True,
                              capture_output=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not run ({e})"
    cap = re.search(r"^capability (\S+)", text, re.M)
    mkl = re.search(r"^MKL_VERBOSE (.*? for Intel\(R\) 64 architecture )?(.*?enabled processors)", text, re.M)
    dnnl = re.search(r"^onednn_verbose,.*?info,cpu,isa:(.*)$", text, re.M)
    return (f"get_cpu_capability() = {cap.group(1) if cap else '?'}; "
            f"MKL_VERBOSE: {mkl.group(2) if mkl else 'no banner'}; "
            f"ONEDNN_VERBOSE isa: {dnnl.group(1).strip() if dnnl else 'no isa line'}")


def numpy_probe():
    import ctypes
    import glob

    import numpy as np

    np.ones((4, 4), dtype=np.float32) @ np.ones((4, 4), dtype=np.float32)
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                     "openblas_get_corename64_", "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                core = fn().decode()
                return f"OpenBLAS core {core} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})"
    return "OpenBLAS core not found (no get_corename in numpy.libs)"


def openvino_probe(args):
    sys.path.insert(0, HERE)
    import common
    import openvino_bench as ob

    compiled = ob.compiled_model(args.onnx, args.threads, "latency")
    tok = common.tokenizer(args.model)
    encoded = [e.ids for e in tok.encode_batch(["A first sentence.", "And a second, longer sentence."])]
    compiled.create_infer_request().infer(ob.feed(*common.pad(encoded, [0, 1])))
    return (f"{__import__('openvino').get_version()}, precision {ob.precision(compiled)}, "
            f"kernels: {ob.primitives(compiled)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", choices=["torch", "torch-child", "numpy", "openvino"])
    ap.add_argument("--onnx")
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.peer == "torch-child":
        torch_child()
        return
    try:
        line = {"torch": torch_probe, "numpy": numpy_probe,
                "openvino": lambda: openvino_probe(args)}[args.peer]()
    except Exception as e:  # the probe reports, it does not stop the comparison
        line = f"probe failed: {type(e).__name__}: {e}"
    print(f"{args.peer}: {line}")


if __name__ == "__main__":
    main()
