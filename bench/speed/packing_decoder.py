"""The decoder's forward + backward on rows of mixed lengths, padded against packed (train.packing),
A/B alternating on one model: what packing saves where it removes padding (docs/speed.md).

    python -m bench.speed.packing_decoder --model DIR [--gguf_file F] [--rows 16] [--min 40] [--max 256] [--rounds 2]

Random token ids (the work depends on lengths only), lengths uniform in [min, max), right-padded;
the loss is the mean square of the last hidden states, so only the decoder runs (no head).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rlhf.models.backbone import decoder_hidden_states
from rlhf.models.loading import load_causal_lm
from rlhf.models.packing import PACKING_ATTRIBUTE, enable_packing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--gguf_file", default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--min", type=int, default=40)
    parser.add_argument("--max", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2, help="timed steps per round and mode")
    args = parser.parse_args()
    model = load_causal_lm(args.model, gguf_file=args.gguf_file)
    enable_packing(model)
    gen = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in torch.randint(args.min, args.max, (args.rows,), generator=gen)]
    width = max(lengths)
    ids = torch.randint(10, 1000, (args.rows, width), generator=gen)
    mask = torch.zeros(args.rows, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1

    def step() -> None:
        hidden = decoder_hidden_states(model, ids, mask)
        hidden.float().pow(2).mean().backward()

    seconds: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(args.rounds):
        for mode in ("padded", "packed"):
            setattr(model, PACKING_ATTRIBUTE, mode == "packed")
            step()  # warm-up
            started = time.perf_counter()
            for _ in range(args.reps):
                step()
            seconds[mode].append((time.perf_counter() - started) / args.reps)
            print(f"{mode}: {seconds[mode][-1]:.2f} s a step", flush=True)
    best = {mode: min(values) for mode, values in seconds.items()}
    print(
        json.dumps(
            {
                "rows": args.rows,
                "tokens": sum(lengths),
                "padded_tokens": args.rows * width,
                "threads": torch.get_num_threads(),
                "seconds": seconds,
                "speedup_packed": round(best["padded"] / best["packed"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
