"""On a CUDA GPU: sampling, SFT, reward-model training, eval and RNG checkpoints on the device.

Skipped (with the reason shown by `pytest -ra`) on a machine without CUDA. Run them on a GPU machine
with `pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from rlhf.config import DPOConfig, RewardConfig, SFTConfig, load_config
from rlhf.data.collate import left_pad
from rlhf.models.logprobs import response_logprobs
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.rundir.checkpoint import rng_state, set_rng_state
from rlhf.stages.dpo import run_dpo
from rlhf.stages.rm import run_reward_training
from rlhf.stages.sft import run_sft

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([" ".join(WORDS)])


@pytest.fixture()
def lm(tok):
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2)
    with torch.no_grad():  # rows end at different steps
        model.lm_head.weight[tok.eos_token_id] += 0.5
    return model


def prompt_batch(tok):
    rows = [tok(" ".join(WORDS[i : i + 1 + i % 4]))["input_ids"] for i in range(10)]
    return left_pad(rows, tok.pad_token_id)


def t_pairs(n: int = 32) -> list[dict]:
    """Preference pairs whose chosen response ends with "t" and whose rejected one holds none."""
    generator = torch.Generator().manual_seed(0)
    plain = [w for w in WORDS if w != "t"]

    def words(k):
        return [plain[i] for i in torch.randint(0, len(plain), (k,), generator=generator).tolist()]

    return [
        {"prompt": " ".join(words(2)), "chosen": " ".join(words(2) + ["t"]), "rejected": " ".join(words(3))}
        for _ in range(n)
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_greedy_tokens_on_cuda_equal_the_cpu_ones(tok, lm):
    ids, mask = prompt_batch(tok)  # on the CPU: generate moves them to the model's device
    config = SamplingConfig(max_new_tokens=24, do_sample=False, repetition_penalty=1.2)
    on_cpu = generate(lm, ids, mask, config, tok.eos_token_id, tok.pad_token_id, return_logprobs=True)
    on_cuda = generate(
        copy.deepcopy(lm).to(CUDA),
        ids,
        mask,
        config,
        tok.eos_token_id,
        tok.pad_token_id,
        return_logprobs=True,
    )
    assert on_cuda.input_ids.device.type == "cuda" and on_cuda.logprobs.device.type == "cuda"
    assert config.check_every(CUDA) == 8  # finished rows are read every 8 steps there
    assert torch.equal(on_cuda.input_ids.cpu(), on_cpu.input_ids)
    assert torch.equal(on_cuda.attention_mask.cpu(), on_cpu.attention_mask)
    torch.testing.assert_close(on_cuda.logprobs.cpu(), on_cpu.logprobs, rtol=0, atol=1e-4)


def test_sampling_on_cuda_is_reproducible_and_the_check_interval_changes_no_token(tok, lm):
    model = lm.to(CUDA)
    ids, mask = prompt_batch(tok)
    config = SamplingConfig(max_new_tokens=24, temperature=1.1, top_p=0.9, top_k=12)
    rollouts = [
        generate(
            model,
            ids,
            mask,
            replace(config, finished_check_every=every),
            tok.eos_token_id,
            tok.pad_token_id,
            torch.Generator(device=CUDA).manual_seed(3),
            return_logprobs=True,
        )
        for every in (1, 8, 8)
    ]
    for other in rollouts[1:]:
        assert torch.equal(other.input_ids, rollouts[0].input_ids)
        torch.testing.assert_close(other.logprobs, rollouts[0].logprobs, rtol=0, atol=1e-5)
    # the sampler's log-probs are those of a full forward
    again, _ = response_logprobs(
        model, rollouts[0].input_ids, rollouts[0].attention_mask, ids.shape[1], config.temperature
    )
    torch.testing.assert_close(again, rollouts[0].logprobs, rtol=0, atol=1e-4)


def test_a_cpu_generator_for_a_cuda_model_is_refused_with_the_fix(tok, lm):
    ids, mask = prompt_batch(tok)
    with pytest.raises(
        ValueError, match=r"generator is on cpu but the model is on cuda.*torch.Generator\(device="
    ):
        generate(lm.to(CUDA), ids, mask, SamplingConfig(max_new_tokens=3), 3, 0, torch.Generator())


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16-pure"])
def test_sft_steps_on_cuda(dtype, tok, tmp_path):
    rows = [
        {
            "prompt": f"{WORDS[i % 20]} {WORDS[(i + 1) % 20]}",
            "response": " ".join(WORDS[(i + j) % 20] for j in (2, 3, 4)),
        }
        for i in range(24)
    ]
    config = load_config(
        SFTConfig,
        overrides={
            "out": str(tmp_path / "sft"),
            "dtype": dtype,
            "gradient_checkpointing": True,
            "data": {"path": write_jsonl(tmp_path / "sft.jsonl", rows), "test_fraction": 0.25},
            "train": {
                "device": "cuda",
                "max_steps": 10,
                "batch_size": 8,
                "micro_batch_size": 4,
                "log_every": 1,
                "eval_every": 5,
            },
            "optim": {"lr": 1e-2, "warmup_steps": 0, "schedule": "constant"},
            "sinks": ["jsonl"],
        },
    )
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    run_sft(config, model=model, tokenizer=tok, quiet=True)
    assert next(model.parameters()).device.type == "cuda"
    logged = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in logged if "train/loss" in r]
    assert losses[-1] < 0.6 * losses[0]
    assert {t.dtype for t in load_file(str(tmp_path / "sft" / "model.safetensors")).values()} == {
        torch.float32
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dpo_steps_on_cuda(dtype, tok, tmp_path):
    pairs = t_pairs()
    config = load_config(
        DPOConfig,
        overrides={
            "out": str(tmp_path / "dpo"),
            "dtype": dtype,
            "data": {"path": write_jsonl(tmp_path / "pairs.jsonl", pairs), "test_fraction": 0.25},
            "train": {
                "device": "cuda",
                "max_steps": 12,
                "batch_size": 8,
                "micro_batch_size": 4,
                "eval_every": 6,
            },
            "optim": {"lr": 1e-2, "warmup_fraction": 0.0, "schedule": "constant"},
            "sinks": ["jsonl"],
        },
    )
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    final = run_dpo(config, model=model, tokenizer=tok, quiet=True)
    assert next(model.parameters()).device.type == "cuda"
    assert final["eval/margin"] > 0 and final["eval/accuracy"] >= 0.75
    assert {t.dtype for t in load_file(str(tmp_path / "dpo" / "model.safetensors")).values()} == {
        torch.float32
    }


def test_reward_model_steps_on_cuda(tok, tmp_path):
    pairs = t_pairs()
    config = load_config(
        RewardConfig,
        overrides={
            "out": str(tmp_path / "rm"),
            "data": {"path": write_jsonl(tmp_path / "pairs.jsonl", pairs), "test_fraction": 0.25},
            "train": {
                "device": "cuda",
                "max_steps": 12,
                "batch_size": 8,
                "micro_batch_size": 4,
                "eval_every": 6,
                "log_every": 1,
                "lm_coef": 0.5,
            },
            "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"},
            "sinks": ["jsonl"],
        },
    )
    model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2)
    )
    final = run_reward_training(config, model=model, tokenizer=tok, quiet=True)
    logged = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
    ranks = [r["train/rank_loss"] for r in logged if "train/rank_loss" in r]
    assert sum(ranks[-3:]) < 0.8 * sum(ranks[:3])
    assert model.head.weight.device.type == "cuda" and model.head.weight.dtype == torch.float32
    loaded = ScalarHeadModel.from_pretrained(tmp_path / "rm", device=CUDA)
    assert next(loaded.parameters()).device.type == "cuda" and final["best_step"] >= 0


def test_cuda_random_state_round_trips_through_a_checkpoint_state():
    torch.cuda.init()
    sampler = torch.Generator(device=CUDA).manual_seed(1)
    state = rng_state({"sampler": sampler})
    assert "cuda" in state and len(state["cuda"]) == torch.cuda.device_count()
    expected = (torch.rand(4, device=CUDA), torch.rand(4, device=CUDA, generator=sampler))
    set_rng_state(state, {"sampler": sampler})
    assert torch.equal(torch.rand(4, device=CUDA), expected[0])
    assert torch.equal(torch.rand(4, device=CUDA, generator=sampler), expected[1])
