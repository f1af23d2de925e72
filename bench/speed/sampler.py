"""New tokens per second of our sampler against transformers' `generate` on the same shapes.

    python -m bench.speed.sampler --model DIR | --shape smollm2 [--device cpu|cuda] [--dtype float32|bfloat16]
        [--batch-sizes 1 16 64] [--new-tokens 128] [--reps 3] [--out bench/results/FILE.json]

DIR is a `save_pretrained` causal LM with its tokenizer (SmolLM2-135M-Instruct: `bench/speed/smollm2.py
convert`); `--shape smollm2` instead builds SmolLM2-135M's shape with random weights and random
prompts of the chat prompts' lengths (a machine that cannot download; EOS is off, so the work is
the same). Every response runs to `--new-tokens` (EOS off, temperature 0.7, no top-k/top-p), so
the work is the same for every sampler: batch x new tokens. Per batch size the samplers run in
turn, `--reps` rounds (ours per engine, generate with a dynamic cache, generate with a static cache,
and with `--hf-compile` generate with a static cache and `torch.compile`), each first once to warm
up; the figures are medians, so that every sampler sees the same machine load. The last stdout line
is the JSON written to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import emit, set_threads


def samplers(args) -> dict:
    """name -> fn(model, ids, mask, seed) -> seconds of one call (the device idle at both ends)."""
    from transformers import CompileConfig, GenerationConfig

    from bench.common import timed
    from rlhf.models.sampling import SamplingConfig, generate

    def ours(engine: str):
        def fn(model, tokenizer, ids, mask, seed, new_tokens):
            config = SamplingConfig(
                max_new_tokens=new_tokens, temperature=0.7, stop_at_eos=False, engine=engine
            )
            generator = torch.Generator(args.device).manual_seed(seed)
            seconds, rollout = timed(
                lambda: generate(
                    model, ids, mask, config, tokenizer.eos_token_id, tokenizer.pad_token_id, generator
                ),
                args.device,
            )
            assert rollout.response_ids.shape[1] == new_tokens
            return seconds

        return fn

    def hf(cache: str | None, compiled: bool = False):
        def fn(model, tokenizer, ids, mask, seed, new_tokens):
            generation = GenerationConfig(
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # EOS never ends a row: the same work as ours
                do_sample=True,
                temperature=0.7,
                top_k=None,
                top_p=None,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                cache_implementation=cache,
            )
            # generate compiles the forward of a static cache by itself on CUDA: only where asked here
            generation.disable_compile = not compiled
            if compiled:
                generation.compile_config = CompileConfig(fullgraph=False)
                generation.compile_config._compile_all_devices = True  # the CPU too
            torch.manual_seed(seed)
            with torch.inference_mode():
                seconds, out = timed(
                    lambda: model.generate(input_ids=ids, attention_mask=mask, generation_config=generation),
                    args.device,
                )
            assert out.shape[1] - ids.shape[1] == new_tokens
            return seconds

        return fn

    table = {f"ours_{engine}": ours(engine) for engine in args.engines}
    for cache in args.hf_caches:
        table[f"hf_{cache}"] = hf(None if cache == "dynamic" else cache)
    if args.hf_compile:
        table["hf_static_compile"] = hf("static", compiled=True)
    return table


def shaped_model(shape: str):
    """(ids-only tokenizer, randomly initialized Llama of `shape`'s sizes): nothing to download (a
    GPU machine without network). With EOS off, the work, and the time, are the trained model's."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, LlamaConfig

    from bench.memory.gpu_memory import SHAPES

    sizes = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["hidden_size"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["num_heads"],
        num_key_value_heads=sizes["kv_heads"],
        intermediate_size=sizes["intermediate_size"],
        max_position_embeddings=2048,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return SimpleNamespace(pad_token_id=0, eos_token_id=2), model


def random_prompts(batch: int, model) -> list[list[int]]:
    """`batch` prompts of 24 to 40 random token ids (the chat prompts' lengths), seeded."""
    generator = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    lengths = torch.randint(24, 41, (batch,), generator=generator).tolist()
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def run(args) -> dict:
    from bench.speed.smollm2 import QUESTIONS, chat_prompts
    from rlhf.data.collate import left_pad
    from rlhf.models.loading import load_causal_lm, load_tokenizer

    if args.model is not None:
        tokenizer = load_tokenizer(args.model)
        model = load_causal_lm(args.model)
    else:
        tokenizer, model = shaped_model(args.shape)
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    table = samplers(args)
    result: dict = {
        "model": args.model.name if args.model else f"{args.shape} shape, random weights",
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "batches": {},
    }
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    for batch in args.batch_sizes:
        prompts = chat_prompts(tokenizer, batch, QUESTIONS) if args.model else random_prompts(batch, model)
        ids, mask = left_pad(prompts, tokenizer.pad_token_id)
        ids, mask = ids.to(args.device), mask.to(args.device)
        seconds: dict[str, list[float]] = {name: [] for name in table}
        errors: dict[str, str] = {}
        for rep in range(args.reps + 1):  # round 0 warms up (a few tokens; all of them to compile)
            for name, fn in table.items():
                if name in errors:
                    continue
                compiles = args.hf_compile or name == "ours_compiled"  # the shapes timed, compiled first
                warm = args.new_tokens if compiles else min(8, args.new_tokens)
                try:
                    s = fn(model, tokenizer, ids, mask, rep, args.new_tokens if rep else warm)
                except Exception as error:  # e.g. a compile that fails on this machine: say why
                    errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                    continue
                if rep:
                    seconds[name].append(s)
                print(f"batch {batch} rep {rep} {name} {s:.3f}s", file=sys.stderr, flush=True)
        tokens = batch * args.new_tokens
        row = {"prompt_width": ids.shape[1], "new_tokens_total": tokens}
        for name, values in seconds.items():
            if values:
                median = statistics.median(values)
                row[name] = {
                    "median_s": round(median, 3),
                    "tok_per_s": round(tokens / median, 1),
                    "seconds": [round(v, 3) for v in values],
                }
        for name, why in errors.items():
            row[name] = {"error": why}
        best = [k for k in row if k.startswith("ours_") and "median_s" in row[k]]
        for theirs in ("hf_dynamic", "hf_static", "hf_static_compile"):
            if best and "median_s" in row.get(theirs, {}):
                fastest = min(best, key=lambda k: row[k]["median_s"])
                row[f"speedup_{fastest}_vs_{theirs}"] = round(
                    row[theirs]["median_s"] / row[fastest]["median_s"], 3
                )
        result["batches"][str(batch)] = row
        if args.out:  # after every batch size: a cut-off run keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a save_pretrained causal LM directory")
    source.add_argument(
        "--shape",
        choices=["smollm2"],
        help="a random-weight model of this shape instead (nothing downloaded)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=None,
        help="our engines to time (default: eager static; cuda_graph and compiled on CUDA)",
    )
    parser.add_argument(
        "--hf-caches",
        nargs="+",
        default=["dynamic", "static"],
        choices=["dynamic", "static"],
        help="generate's caches to time",
    )
    parser.add_argument(
        "--hf-compile", action="store_true", help="also generate with a static cache + torch.compile"
    )
    parser.add_argument(
        "--out", type=Path, help="write the JSON here too (e.g. bench/results/sampler_cpu.json)"
    )
    args = parser.parse_args()
    if args.engines is None:
        args.engines = ["eager", "static"] + (["cuda_graph", "compiled"] if args.device == "cuda" else [])
    set_threads(args.threads)
    emit(run(args))


if __name__ == "__main__":
    main()
