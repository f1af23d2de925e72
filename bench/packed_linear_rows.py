"""oneDNN's prepacked linear (the sampler's `pack_weights`) against `F.linear` by rows per call, on
SmolLM2-135M's weight shapes (issue 37: where the batch-1 sampler lost to transformers' generate).

    python -m bench.packed_linear_rows [--threads 2] [--rows 1 2 4 16 64] [--reps 30]

Per shape and row count: the fastest and the 25th-percentile microseconds of `--reps` alternated
calls of each (a shared machine's load lands on both). Prints one line per row count.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [(1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576)]  # MLP up/down, q/o, k/v, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for rows in args.rows:
        cells = []
        for out_features, in_features in SHAPES:
            weight, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            plain_s, packed_s = [], []
            for rep in range(args.reps + 3):  # 3 warm-up calls each
                t = time.perf_counter()
                F.linear(x, weight)
                middle = time.perf_counter()
                torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")
                end = time.perf_counter()
                if rep >= 3:
                    plain_s.append(middle - t)
                    packed_s.append(end - middle)
            plain_s.sort()
            packed_s.sort()
            q = len(plain_s) // 4
            cells.append(
                f"{out_features}x{in_features} F.linear {plain_s[0] * 1e6:.0f}/{plain_s[q] * 1e6:.0f} us"
                f" packed {packed_s[0] * 1e6:.0f}/{packed_s[q] * 1e6:.0f} us"
            )
        print(f"rows {rows}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
