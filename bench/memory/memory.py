"""Peak memory of each stage on a real model and real data, against the floor it could reach.

    .venv/bin/python bench/memory/memory.py                       # sft, rm, train: 20-40 min on 2 cores
    .venv/bin/python bench/memory/memory.py --stages sft,sft+gc --before OLD.json

Each stage runs the `rlhf` command in its own subprocess (a clean heap; its peak resident set is
read with wait4) on SmolLM2-135M-Instruct in float32 (--model DIR or $RLHF_BENCH_MODEL) and HH-RLHF
harmless-base pairs (--pairs FILE or $RLHF_BENCH_PAIRS: the first 1,500 of harmless-base test; the
longest ones are used), with these shapes: prompts and responses
<= 256 tokens each, 8 sequences per SFT and RM micro-batch, PPO-max with a LoRA policy on
8 prompts <= 256 tokens, 64 new tokens, micro-batches of up to 4 rows (the constants below; the
preset's 4 minibatches of 8 rollouts make each update micro-batch 2 rows).
Two steps each: the peak is reached once the optimizer state exists and a micro-batch is in
flight, i.e. in the second step.

The floor of each stage (`floor`): weights of every model held + gradients and AdamW's two
moments for what trains + the activations autograd keeps for one micro-batch as wide as the
stage's longest row (`activation_bytes`: the decoder's saved tensors, counted per layer below) +
the interpreter with torch, transformers and peft imported (`libraries`, measured). A peak
near the floor leaves nothing to find but the knobs (docs/memory.md).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import child_env, run_case  # noqa: E402

# where the model and the pairs are: flags, else these environment variables (no machine paths here)
MODEL_ENV, PAIRS_ENV = "RLHF_BENCH_MODEL", "RLHF_BENCH_PAIRS"
MIB = 1 << 20
F32 = 4

# The shapes: prompts <= 256 tokens, responses <= 256 (PPO: 64 new
# tokens), 8 rollouts per PPO iteration, SFT micro-batches of 8 sequences (the default). The reward
# model's micro-batches hold 2 pairs (4 sequences; default 8 pairs) and the PPO update's 4 rows
# (default 16): on the longest HH rows the defaults peak near 15 GB (RM) on a 23 GB machine that
# other jobs share, and a loaded 2-core machine runs a step of 8 x 460 tokens in minutes.
# Activations grow linearly with a micro-batch's rows; each floor is computed for these shapes.
SFT_ROWS, RM_PAIRS, PROMPT_TOKENS = 8, 2, 256
PPO_ROWS, PPO_MICRO_ROWS, PPO_NEW_TOKENS = 8, 4, 64
PPO_MINIBATCHES = 4  # the ppo_max preset's train.minibatches: its micro-batches hold 8 / 4 = 2 rows


def model_shape(model: Path) -> dict:
    """Sizes from config.json: parameters (tied head counted once), layers, widths."""
    c = json.loads((model / "config.json").read_text())
    h, i, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h  # q,k,v,o + gate,up,down + 2 norms
    params = layers * per_layer + vocab * h + h + (0 if c.get("tie_word_embeddings") else vocab * h)
    return {
        "params": params,
        "layers": layers,
        "hidden": h,
        "intermediate": i,
        "q": q,
        "kv": kv,
        "heads": c["num_attention_heads"],
        "vocab": vocab,
    }


def activation_bytes(shape: dict, rows: int, width: int) -> int:
    """float32 bytes autograd keeps over a Llama decoder's forward of `rows` x `width` positions
    (transformers' sdpa attention with a padding mask), per token and layer: 7 h-wide tensors (the
    two RMSNorms' inputs and float32 products, the attention output, o_proj's input, the residual),
    q and k, v repeated to the query heads (3 q-wide), the MLP's gate and up outputs, silu(gate) and
    down_proj's input (4 i-wide), the additive mask's row (`width`) and a log-sum-exp per head; plus
    the embeddings and the final norm (2 h). Counted with `torch.autograd.graph.saved_tensors_hooks`
    (bench/tests/test_memory.py). The output head's logits are not counted: a loss needs one
    log-prob per token, not the vocabulary."""
    h, i, q, heads = shape["hidden"], shape["intermediate"], shape["q"], shape["heads"]
    per_token_layer = 7 * h + 3 * q + 4 * i + heads + width
    return F32 * rows * width * (shape["layers"] * per_token_layer + 2 * h)


def lora_activation_bytes(shape: dict, rows: int, width: int, rank: int = 8) -> int:
    """`activation_bytes` of a decoder whose base weights are frozen, with LoRA adapters of `rank`
    on q_proj and v_proj (PEFT's default for Llama). Autograd saves an operand only for the
    gradients it feeds, and a frozen weight needs none: the inputs of k_proj, o_proj and the three
    MLP projections and the RMSNorms' normalized outputs are not kept (the adapters keep the
    attention input once, shared by q and v, and their rank-wide outputs). Per token and layer:
    3 h-wide (the two RMSNorms' inputs, the adapters' input), 4 q-wide (q, k and v repeated to the
    query heads, q's adapter sum), 3 i-wide (gate, up, silu(gate)), 2 x rank, the mask's row, a
    log-sum-exp per head; plus the rotary table (Counted: bench/tests/test_memory.py.)"""
    h, i, q, heads = shape["hidden"], shape["intermediate"], shape["q"], shape["heads"]
    per_token_layer = 3 * h + 4 * q + 3 * i + 2 * rank + heads + width + 2
    return F32 * rows * width * (shape["layers"] * per_token_layer + q // heads * 2)


def ppo_micro_rows() -> int:
    """Rows of each PPO update micro-batch: a minibatch is 1/PPO_MINIBATCHES of the rollout batch,
    cut into micro-batches of at most PPO_MICRO_ROWS rows."""
    return min(PPO_MICRO_ROWS, -(-PPO_ROWS // PPO_MINIBATCHES))


def floors(model: Path, widths: dict[str, int]) -> dict:
    """The floor of each stage in MiB, and what it is made of; `widths`: each stage's longest row
    (prompt + response tokens), the width of its widest micro-batch."""
    s = model_shape(model)
    w = F32 * s["params"]
    full_train = 4 * w  # weights + gradients + AdamW exp_avg + exp_avg_sq
    sft_act = activation_bytes(s, SFT_ROWS, widths["sft"])
    rm_act = activation_bytes(s, 2 * RM_PAIRS, widths["rm"])
    lora = lora_params(s, rank=8)
    rows = ppo_micro_rows()
    ppo = {
        # policy (also the reference: its adapter off) + reward model + critic trained in full
        "weights": w + w + w,
        "trained": 3 * F32 * lora + 3 * w,  # LoRA grads+moments, critic grads+moments
        # policy and critic steps overlap on two cores (runtime.overlap_critic): one micro-batch of
        # each alive at once; the LoRA policy keeps less than the fully trained critic
        "activations": lora_activation_bytes(s, rows, widths["train"])
        + activation_bytes(s, rows, widths["train"]),
    }
    out = {
        "sft": {"weights": w, "trained": full_train - w, "activations": sft_act},
        "rm": {"weights": w, "trained": full_train - w, "activations": rm_act},
        "train": ppo,
    }
    for parts in out.values():
        parts["floor"] = sum(parts.values())
    return {stage: {k: round(v / MIB) for k, v in parts.items()} for stage, parts in out.items()}


def lora_params(shape: dict, rank: int) -> int:
    """LoRA A and B on q_proj and v_proj of every layer (PEFT's default targets for Llama)."""
    h, q, kv = shape["hidden"], shape["q"], shape["kv"]
    return shape["layers"] * rank * ((h + q) + (h + kv))


# -- data ------------------------------------------------------------------------------------------


def write_data(
    directory: Path, model: Path, rows: int, hh_pairs: Path
) -> tuple[dict[str, Path], dict[str, int]]:
    """For each stage, the `rows` HH pairs whose encoded rows are longest (as the stage encodes
    them: chat template, budgets), written as they are (`hh` format: SFT takes the chosen
    dialogue, RM the pair, train the prompt). Every micro-batch is then about as wide as the
    longest of a whole run, the peak does not depend on which rows a short run draws, and the
    floor's activations are counted at the longest row (returned: tokens per stage)."""
    from transformers import AutoTokenizer

    from rlhf.config import RewardConfig, SFTConfig, load_config
    from rlhf.data.loading import load_examples
    from rlhf.data.tokenize import TruncationStats
    from rlhf.stages.rm import encode_pairs
    from rlhf.stages.sft import encode_sft_examples

    with gzip.open(hh_pairs, "rt") as f:
        lines = [line for line in f if line.strip()]
    every = directory / "all.jsonl"
    every.write_text("".join(lines))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    with contextlib.redirect_stderr(io.StringIO()):  # 5 of the 1,500 pairs have an empty turn: skipped
        sft_examples = load_examples(every, kind="sft", skip_invalid=True).examples
        pair_examples = load_examples(every, kind="preference", skip_invalid=True).examples
    sft = encode_sft_examples(tokenizer, sft_examples, load_config(SFTConfig), TruncationStats())
    pairs = encode_pairs(tokenizer, pair_examples, load_config(RewardConfig), TruncationStats())
    line_of = {  # stage -> (line index, encoded length) of every valid record
        "sft": [
            (e.source.line - 1, len(r.prompt_ids) + len(r.response_ids)) for e, r in zip(sft_examples, sft)
        ],
        "rm": [
            (e.source.line - 1, len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)))
            for e, r in zip(pair_examples, pairs)
        ],
        "train": [
            (e.source.line - 1, len(r.prompt_ids) + PPO_NEW_TOKENS) for e, r in zip(pair_examples, pairs)
        ],
    }
    paths, widths = {}, {}
    for stage, sizes in line_of.items():
        longest = sorted(sizes, key=lambda item: -item[1])[:rows]
        paths[stage] = directory / f"{stage}.jsonl"
        paths[stage].write_text("".join(lines[k] for k, _ in sorted(longest)))
        widths[stage] = longest[0][1]
    return paths, widths


def directory_mib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / MIB, 1)


# -- stages ------------------------------------------------------------------------------------------


def rlhf_command(*args: str) -> list[str]:
    """`rlhf ARGS` in a subprocess that prints `{"exit": code}` last (what run_case reads)."""
    code = (
        "import json, sys; from rlhf.cli import main; c = main(); print(json.dumps({'exit': c})); sys.exit(c)"
    )
    return [sys.executable, "-c", code, *args]


# Knobs measured beside the default stages (`--stages sft,rm,train,sft+gc,...`): (stage, extra flags)
# and, in ENVIRONMENTS, the variables a variant sets in the stage's environment
ENVIRONMENTS = {"train-one_arena": {"MALLOC_ARENA_MAX": "1"}}  # glibc: every thread allocates from one arena
VARIANTS = {
    "train-one_arena": ("train", []),
    "sft+gc": ("sft", ["--gradient_checkpointing", "true"]),
    "rm+gc": ("rm", ["--gradient_checkpointing", "true"]),
    "train+gc": ("train", ["--model.gradient_checkpointing", "true"]),
    "train-overlap": ("train", ["--runtime.overlap_critic", "false"]),
    "train-keep_freed": ("train", ["--runtime.keep_freed_memory", "false"]),
    "train+critic_lora": ("train", ["--model.critic_lora.enabled", "true"]),
}


def stage_command(
    stage: str, model: Path, data: dict[str, Path], reward_model: Path, out: Path, steps: int
) -> list[str]:
    """The `rlhf` command of `stage` with the issue's shapes, writing into `out`."""
    quiet = ["--train.eval_every", "1000", "--optim.warmup_steps", "0", "--sinks", "[jsonl]"]
    split = ["--train.max_steps", str(steps), "--data.test_fraction", "0.05", *quiet]
    if stage == "sft":
        rows = ["--train.batch_size", str(SFT_ROWS), "--train.micro_batch_size", str(SFT_ROWS)]
        return rlhf_command(
            "sft", "--model", str(model), "--data", str(data["sft"]), "--out", str(out), *rows, *split
        )
    if stage == "rm":
        rows = ["--train.batch_size", str(RM_PAIRS), "--train.micro_batch_size", str(RM_PAIRS)]
        return rlhf_command(
            "rm", "--model", str(model), "--data", str(data["rm"]), "--out", str(out), *rows, *split
        )
    shapes = ["--rollout.batch_size", str(PPO_ROWS), "--rollout.max_new_tokens", str(PPO_NEW_TOKENS)]
    shapes += [
        "--train.micro_batch_size",
        str(PPO_MICRO_ROWS),
        "--data.max_prompt_tokens",
        str(PROMPT_TOKENS),
    ]
    shapes += ["--model.lora.enabled", "true"]
    short = ["--train.iterations", str(steps), "--critic.pretrain_iterations", "0", "--checkpoint.every", "1"]
    models = ["--policy", str(model), "--reward-model", str(reward_model), "--prompts", str(data["train"])]
    return rlhf_command(
        "train", "--preset", "ppo_max", *models, "--out", str(out), *shapes, *short, "--log.sinks", "[jsonl]"
    )


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rlhf-memory-"))
    results: dict = {"model": args.model.name, "threads": args.threads, "steps": args.steps, "stages": {}}
    try:
        data, widths = write_data(work, args.model, args.rows, args.pairs)
        results["longest_row_tokens"] = widths
        results["floor_mib"] = floors(args.model, widths)
        env = child_env(args.threads)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        # the interpreter with torch, transformers and peft imported: part of every stage's floor
        code = "import json, peft, torch, transformers, rlhf.cli; print(json.dumps({}))"
        libraries = run_case([sys.executable, "-c", code], env=env, cwd=str(work), timeout=600)["maxrss_mb"]
        results["libraries_mib"] = libraries
        for parts in results["floor_mib"].values():
            parts["libraries"] = round(libraries)
            parts["floor"] += round(libraries)
        stages = args.stages.split(",")
        unknown = [name for name in stages if name not in ("sft", "rm", "train", *VARIANTS)]
        if unknown:
            raise SystemExit(f"unknown stage {unknown[0]!r}: use sft, rm, train or {', '.join(VARIANTS)}")
        needs_rm = any(VARIANTS.get(name, (name,))[0] == "train" for name in stages)
        if needs_rm and "rm" not in stages and args.reward_model is None:
            stages.insert(0, "rm")  # the train stage's reward model
        reward_model = args.reward_model or work / "rm"
        for stage in stages:
            base, extra = VARIANTS.get(stage, (stage, []))
            command = stage_command(base, args.model, data, reward_model, work / stage, args.steps) + extra
            print(f"[memory] {stage} ...", file=sys.stderr, flush=True)
            outcome = run_case(
                command, env={**env, **ENVIRONMENTS.get(stage, {})}, cwd=str(work), timeout=args.timeout
            )
            record = {"peak_rss_mib": outcome["maxrss_mb"], "wall_s": outcome["wall_s"]}
            if "error" in outcome:
                record["error"] = outcome["error"]
            run_dir = work / stage
            checkpoints = sorted((run_dir / "checkpoints").glob("iter_*")) if run_dir.is_dir() else []
            if checkpoints:
                record["checkpoint_mib"] = directory_mib(checkpoints[-1])
                record["checkpoints_mib"] = directory_mib(run_dir / "checkpoints")
            if run_dir.is_dir():
                record["run_dir_mib"] = directory_mib(run_dir)
            results["stages"][stage] = record
            print(f"[memory] {stage}: {json.dumps(record)}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def print_table(results: dict, before: dict | None) -> None:
    print(f"{'stage':8} {'before MiB':>11} {'peak MiB':>9} {'floor MiB':>10}  checkpoint MiB")
    for stage, record in results["stages"].items():
        was = (before or {}).get("stages", {}).get(stage, {}).get("peak_rss_mib")
        floor = results["floor_mib"][VARIANTS.get(stage, (stage,))[0]]["floor"]
        print(
            f"{stage:8} {was if was is not None else '-':>11} {record['peak_rss_mib']:>9} {floor:>10}"
            f"  {record.get('checkpoint_mib', '-')}"
            + (f"  ERROR {record['error']}" if "error" in record else "")
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=os.environ.get(MODEL_ENV), help=f"(or ${MODEL_ENV})")
    parser.add_argument(
        "--pairs", type=Path, default=os.environ.get(PAIRS_ENV), help=f"HH pairs, .jsonl.gz (or ${PAIRS_ENV})"
    )
    parser.add_argument("--stages", default="sft,rm,train")
    parser.add_argument("--rows", type=int, default=24, help="HH pairs per stage (the longest)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (train: iterations) per stage")
    parser.add_argument(
        "--reward-model", type=Path, help="reward model of the train stages (default: the rm stage's)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per stage")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/memory_stages.json")
    parser.add_argument("--before", type=Path, help="an earlier result to print beside this one")
    args = parser.parse_args()
    if not args.model or not args.pairs or not args.model.is_dir() or not args.pairs.is_file():
        print(
            f"memory bench skipped: needs a model directory (--model or ${MODEL_ENV}: {args.model}) and HH "
            f"pairs (--pairs or ${PAIRS_ENV}: {args.pairs})",
            file=sys.stderr,
        )
        return 0
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    before = json.loads(args.before.read_text()) if args.before and args.before.is_file() else None
    print_table(results, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
