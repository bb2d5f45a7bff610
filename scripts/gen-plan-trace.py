#!/usr/bin/env python3
"""Writes a synthetic buffer trace in the MiniMalloc CSV format to stdout.

usage: gen-plan-trace.py [BUFFERS] [SEED]   (defaults: 1000000, 42)

The shape is the one of benches/plan.rs, with the same generator: buffers born
two per step in program order, 80% living 1-4 steps, 18% 4-43 steps and 2% up
to a quarter of the trace; sizes 64 B to 512 KiB in powers of two; alignment 64.
The same BUFFERS and SEED always give the same file.
"""
import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    state = int(sys.argv[2]) if len(sys.argv) > 2 else 42
    mask = (1 << 64) - 1

    def below(m):
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        return (state >> 33) % m

    out = ["id,lower,upper,size,alignment"]
    for i in range(n):
        lower = i // 2
        r = below(100)
        if r < 80:
            width = 1 + below(4)
        elif r < 98:
            width = 4 + below(40)
        else:
            width = 40 + below(n // 4 + 1)
        size = 64 << below(14)
        out.append(f"{i},{lower},{lower + width},{size},64")
    sys.stdout.write("\n".join(out))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
