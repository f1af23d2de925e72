"""Where the bf16 critic NaN of the SmolLM2 + HH GPU run comes from (examples/smollm2_hh/README.md):
the critic initialized from the reward model, trained on left-padded prompt + right-padded response
rows by a masked value loss, Adam at the PPO critic's rate, under each precision and SDPA kernel.

    python -m bench.studies.critic_nan_gpu --reward-model HH_OUT/rm --pairs HH_OUT/data/rm_heldout.jsonl  # a GPU
    python -m bench.studies.critic_nan_gpu --shape smollm2          # SmolLM2's shape, random weights, a GPU
    python -m bench.studies.critic_nan_gpu --tiny                                   # a CPU smoke test, tiny Llama

Measured on a CPU (torch 2.13, transformers 5.24; `--tiny`, and by hand): Hugging Face hands SDPA a
boolean mask in which every left-pad query row is fully masked; the CPU math and flash kernels return
0 there, forward and backward, in float32 and bfloat16, so nothing non-finite reaches the valid rows.
The CUDA kernels (memory-efficient, cuDNN) are the candidates, which only a GPU can answer. Each mode
reports: the first step whose loss, values or gradients are not finite; the first module whose output
is not finite (forward hooks, in call order); and for that step, the op `torch.autograd.detect_anomaly`
names. The mode `bf16 right-padded` holds the same tokens with every row right-padded whole, so no
query row is fully masked (Hugging Face once unmasked such rows on CUDA for this reason,
AttentionMaskConverter._unmask_unattended): if it alone of the bf16 modes stays finite, fully masked
rows are the mechanism. One JSON line per mode, then a summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def build_rows(
    tokenizer,
    pairs_path: str | None,
    rows: int,
    prompt_tokens: int,
    response_tokens: int,
    vocab: int,
    right_padded: bool = False,
):
    """(ids, attention mask, response mask) [rows, T]: each prompt left-padded and each response
    right-padded (the sampler's layout: the left pads' query rows see no key), or with
    `right_padded` each prompt + response right-padded whole (no fully masked row); HH pairs'
    prompt + chosen, or random ids."""
    from rlhf.data.collate import left_pad, right_pad

    prompts, responses = [], []
    if pairs_path:
        from rlhf.data.loading import load_examples
        from rlhf.data.tokenize import encode_prompt, encode_response

        examples = load_examples(pairs_path, kind="preference", skip_invalid=True).examples[:rows]
        for ex in examples:
            prompts.append(encode_prompt(tokenizer, ex.prompt, prompt_tokens, system_prompt="none"))
            responses.append(
                encode_response(tokenizer, ex.chosen, response_tokens, None, tokenizer.eos_token_id)
            )
    else:
        gen = torch.Generator().manual_seed(0)
        for i in range(rows):
            p = 1 + (i * 7) % prompt_tokens
            r = 1 + (i * 5) % response_tokens
            prompts.append(torch.randint(4, vocab, (p,), generator=gen).tolist())
            responses.append(torch.randint(4, vocab, (r,), generator=gen).tolist())
    pad = tokenizer.pad_token_id
    if right_padded:
        ids, mask = right_pad([p + r for p, r in zip(prompts, responses)], pad)
        response_mask = torch.zeros_like(mask)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            response_mask[i, len(p) : len(p) + len(r)] = 1
        return ids, mask, response_mask
    p_ids, p_mask = left_pad(prompts, pad)
    r_ids, r_mask = right_pad(responses, pad)
    ids = torch.cat([p_ids, r_ids], 1)
    mask = torch.cat([p_mask, r_mask], 1)
    response_mask = torch.cat([torch.zeros_like(p_mask), r_mask], 1)
    return ids, mask, response_mask


def first_nonfinite_module(model):
    """Forward hooks: the name of the first module (in call order) whose tensor output is not finite."""
    found: list[str] = []
    handles = []
    for name, module in model.named_modules():

        def hook(_module, _inputs, output, name=name):
            out = output[0] if isinstance(output, tuple) else output
            if (
                not found
                and torch.is_tensor(out)
                and out.is_floating_point()
                and not torch.isfinite(out).all()
            ):
                found.append(name or "(root)")

        handles.append(module.register_forward_hook(hook))
    return found, handles


def run_mode(name: str, args, device: str) -> dict:
    from rlhf.models.scalar_head import ScalarHeadModel

    torch.manual_seed(0)
    if args.tiny or args.shape:
        from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

        tok = word_tokenizer([" ".join(f"w{i}" for i in range(60))])
        if args.shape:  # SmolLM2-135M's shape, random weights (a GPU machine without the recipe's judge)
            from bench.memory.gpu_memory import causal_lm

            lm = causal_lm(args.shape, tok, 0)
        else:
            lm = tiny_causal_lm(tok, seed=0, hidden_size=64, num_layers=2, num_heads=4)
        critic = ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)
    else:
        from rlhf.models.loading import load_tokenizer

        tok = load_tokenizer(args.reward_model)
        critic = ScalarHeadModel.from_pretrained(args.reward_model)  # float32 weights, as the GPU run
    critic.to(device).train()
    ids, mask, response_mask = build_rows(
        tok,
        args.pairs,
        args.rows,
        args.prompt_tokens,
        args.response_tokens,
        len(tok),
        right_padded=name.endswith("right-padded"),
    )
    ids, attn, response_mask = ids.to(device), mask.to(device), response_mask.to(device)
    with torch.no_grad():  # returns: the reward model's own scores, as PPO's first targets
        targets = critic.score(ids, attn).float()
    optim = torch.optim.Adam(critic.parameters(), lr=args.lr)
    bf16 = name.startswith("bf16")
    backend = {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
    }.get(name.split()[-1])
    result: dict = {
        "mode": name,
        "first_bad_step": None,
        "first_bad_module": None,
        "anomaly": None,
        "losses": [],
    }
    found, handles = first_nonfinite_module(critic)
    try:
        for step in range(args.steps):
            ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
            autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)
            with ctx, autocast:
                hidden = critic.hidden_states(ids, attn)
                values = critic.values_from_hidden(hidden)
            valid = response_mask.bool()
            loss = ((values.float() - targets[:, None]) ** 2)[valid].mean()
            optim.zero_grad()
            loss.backward()
            grads_ok = all(p.grad is None or torch.isfinite(p.grad).all() for p in critic.parameters())
            result["losses"].append(float(loss.detach()))
            if not (math.isfinite(float(loss.detach())) and grads_ok):
                result["first_bad_step"] = step
                result["values_finite"] = bool(torch.isfinite(values[valid]).all())
                result["grads_finite"] = grads_ok
                result["first_bad_module"] = found[0] if found else None
                result["anomaly"] = anomaly_of(
                    critic, ids, attn, response_mask, targets, bf16, backend, device, name
                )
                break
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            optim.step()
    except RuntimeError as error:  # a kernel that refuses the mask (flash with a mask)
        result["error"] = str(error)[:200]
    finally:
        for h in handles:
            h.remove()
    result["value_scale"] = float(targets.abs().mean())
    return result


def anomaly_of(critic, ids, attn, response_mask, targets, bf16, backend, device, name) -> str | None:
    """The op torch.autograd.detect_anomaly names on one more forward and backward of this step."""
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    try:
        with torch.autograd.detect_anomaly(check_nan=True), ctx:
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                hidden = critic.hidden_states(ids, attn)
                values = critic.values_from_hidden(hidden)
            loss = ((values.float() - targets[:, None]) ** 2)[response_mask.bool()].mean()
            critic.zero_grad()
            loss.backward()
    except RuntimeError as error:
        return str(error).splitlines()[0][:300]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reward-model", help="the recipe's judge 1 (the critic's initialization)")
    parser.add_argument("--pairs", help="HH pairs: prompt + chosen rows (default: random ids)")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama on the CPU (smoke test)")
    parser.add_argument("--shape", choices=["smollm2"], help="this model's shape with random weights")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=192)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="Adam steps per mode (the GPU run died at 3)")
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args()
    if not (args.tiny or args.shape or args.reward_model):
        parser.error("--reward-model DIR (or --shape smollm2, or --tiny)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ["float32", "bf16 default", "bf16 math", "bf16 efficient", "bf16 cudnn", "bf16 right-padded"]
    if device == "cpu":
        modes = ["float32", "bf16 default", "bf16 math", "bf16 flash", "bf16 right-padded"]
    results = []
    for mode in modes:
        t0 = time.perf_counter()
        result = run_mode(mode, args, device)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(result)
        print(json.dumps(result), flush=True)
    print(json.dumps({
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "non_finite": [r["mode"] for r in results if r["first_bad_step"] is not None],
        "finite": [r["mode"] for r in results if r["first_bad_step"] is None and "error" not in r],
        "refused": [r["mode"] for r in results if "error" in r],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
