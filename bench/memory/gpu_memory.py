"""Peak GPU memory per phase of one PPO-max iteration on CUDA, for checking a memory model
(`rlhf plan`) against the device's allocator.

Workloads (random-init Llama shapes, nothing downloaded):
    m84      hidden 1024, 8 layers, 16 heads, MLP 2048, vocab 4000: the 84M-parameter workload of
             docs/distributed.md (rollout 8 prompts x 8 tokens, 2 minibatches)
    smollm2  SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab
             49152), rollout 8 x 64 tokens, 2 minibatches

    python -m bench.memory.gpu_memory --workload m84 --dtype bfloat16 --device cuda

Per phase (generate, score, forward = the no-grad log-probs and values, update) the peak of
torch.cuda.max_memory_allocated since the phase began, and the bytes allocated before the first
iteration (weights and whatever the roles keep). The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from bench.common import emit, reset_peak_memory, synchronize

SHAPES = {
    "m84": dict(
        hidden_size=1024, num_layers=8, num_heads=16, kv_heads=16, intermediate_size=2048, vocab=4000
    ),
    # `rlhf sft` under torchrun (bench/memory/dist_memory.py --stage sft): hidden 512, 8 layers, 29M parameters
    "m512": dict(hidden_size=512, num_layers=8, num_heads=8, kv_heads=8, intermediate_size=1376, vocab=4000),
    "smollm2": dict(
        hidden_size=576, num_layers=30, num_heads=9, kv_heads=3, intermediate_size=1536, vocab=49152
    ),
}
ROLLOUT = {"m84": (8, 8), "smollm2": (8, 64), "m512": (8, 8)}  # prompts per iteration, response tokens


def causal_lm(name: str, tokenizer, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = SHAPES[name]
    config = LlamaConfig(
        vocab_size=max(len(tokenizer), shape["vocab"]),
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["kv_heads"],
        intermediate_size=shape["intermediate_size"],
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=name == "smollm2",
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def allocated_mb(device: torch.device, peak: bool = False) -> float:
    """The CUDA allocator's bytes in tensors now (or their peak since the last reset), in MiB; 0 on
    the CPU (the script runs there only to check itself)."""
    if device.type != "cuda":
        return 0.0
    return (torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated)(device) / 2**20


def phase_peaks(trainer, device: torch.device) -> dict:
    """Wrap each phase's entry so that it records the allocator's peak over its call."""
    peaks: dict[str, float] = {}
    roles = trainer.runtime.roles

    def wrap(owner, attr: str, phase: str) -> None:
        original = getattr(owner, attr)

        def measured(*args, **kwargs):
            synchronize(device)
            reset_peak_memory(device)
            try:
                return original(*args, **kwargs)
            finally:
                synchronize(device)
                peak = allocated_mb(device, peak=True)
                peaks[phase] = round(max(peaks.get(phase, 0.0), peak), 1)

        setattr(owner, attr, measured)

    wrap(roles.policy, "generate", "generate")
    wrap(roles.reward_model, "score", "score")
    wrap(trainer, "forwards", "forward")
    wrap(trainer, "update", "update")
    return peaks


def shaped_models(name: str, seed: int = 0):
    """(word tokenizer of the shape's vocabulary, the peer workload's prompts, a policy, a reward
    model's causal LM): random-weight models of SHAPES[name], nothing downloaded."""
    from bench.speed.workload import build_prompts, build_tokenizer

    rng = random.Random(seed)
    tokenizer, words = build_tokenizer(SHAPES[name]["vocab"], rng)
    prompts = build_prompts(tokenizer, words, rng)
    return tokenizer, prompts, causal_lm(name, tokenizer, seed), causal_lm(name, tokenizer, seed + 2)


def run(name: str, dtype: str, device: str, iters: int, seed: int = 0) -> dict:
    from rlhf.config import RLConfig, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    dev = torch.device(device)
    tokenizer, prompts, policy, reward_lm = shaped_models(name, seed)
    reward_model = ScalarHeadModel.from_causal_lm(reward_lm)
    params = sum(p.numel() for p in policy.parameters())
    batch, tokens = ROLLOUT[name]
    with tempfile.TemporaryDirectory(prefix="bench_gpu_memory_") as run_dir:
        overrides = {
            "out": run_dir,
            "seed": seed,
            "dtype": dtype,
            "rollout": {"batch_size": batch, "max_new_tokens": tokens, "stop_at_eos": False},
            "train": {"device": device, "iterations": iters, "minibatches": 2, "micro_batch_size": 4},
            "critic": {"pretrain_iterations": 0},
            "log": {"sinks": []},
        }
        config = load_config(RLConfig, preset="ppo_max", overrides=overrides)
        reset_peak_memory(dev)
        roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
        trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), prompts, run_dir=run_dir, quiet=True)
        synchronize(dev)
        resident = allocated_mb(dev)
        peaks = phase_peaks(trainer, dev)
        walls = []
        for _ in range(iters):
            start = time.perf_counter()
            trainer.step()
            synchronize(dev)
            walls.append(round(time.perf_counter() - start, 3))
            trainer.iteration += 1
        after = allocated_mb(dev)
        trainer.logger.close()
    return {
        "workload": name,
        "dtype": dtype,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "policy_parameters": params,
        "rollout": {"prompts": batch, "response_tokens": tokens, "minibatches": 2, "micro_batch": 4},
        "allocated_before_mb": round(resident, 1),
        "allocated_after_mb": round(after, 1),
        "phase_peak_allocated_mb": peaks,
        "peak_allocated_mb": max(peaks.values()),
        "max_reserved_mb": round(torch.cuda.max_memory_reserved(dev) / 2**20, 1)
        if dev.type == "cuda"
        else 0.0,
        "seconds_per_iteration": walls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(SHAPES), default="m84")
    parser.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | bfloat16-pure")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=2)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        emit({"skipped": "no CUDA device (torch.cuda.is_available() is False)"})
        return
    emit(run(args.workload, args.dtype, args.device, args.iters))


if __name__ == "__main__":
    main()
