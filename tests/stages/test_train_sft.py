"""SFT: the loss covers response tokens only, training lowers it, and the run directory is a
Hugging Face model directory."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.config import ConfigError, SFTConfig, load_config
from rlhf.data.collate import collate_sft
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.sft import EncodedSFT, run_sft
from rlhf.train.lm_loss import model_token_nll, token_nll
from tests.support.train_testing import WORDS, write_jsonl


def sft_rows(n: int) -> list[dict]:
    """Prompt: two consecutive words; response: the next three (a rule a tiny model can learn)."""
    k = len(WORDS)
    return [
        {
            "prompt": f"{WORDS[i % k]} {WORDS[(i + 1) % k]}",
            "response": " ".join(WORDS[(i + j) % k] for j in (2, 3, 4)),
        }
        for i in range(n)
    ]


def sft_config(tmp_path, **overrides) -> SFTConfig:
    base = {
        "out": str(tmp_path / "sft"),
        "data": {"path": str(write_jsonl(tmp_path / "sft.jsonl", sft_rows(24))), "test_fraction": 0.25},
        "train": {"max_steps": 12, "batch_size": 8, "micro_batch_size": 3, "eval_every": 6, "log_every": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "schedule": "constant"},
        "sinks": ["jsonl"],
    }
    for group, values in overrides.items():
        base[group] = {**base.get(group, {}), **values} if isinstance(values, dict) else values
    return load_config(SFTConfig, overrides=base)


def log_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- the loss ----------------------------------------------------------------------------------
def nll_by_hand(logits, input_ids, loss_mask) -> tuple[float, int]:
    total, count = 0.0, 0
    for b in range(input_ids.shape[0]):
        for t in range(1, input_ids.shape[1]):  # token t is predicted by the logits at t - 1
            if loss_mask[b, t]:
                total -= float(torch.log_softmax(logits[b, t - 1], -1)[input_ids[b, t]])
                count += 1
    return total, count


def test_token_nll_matches_a_hand_loop_and_ignores_prompt_positions():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 5, generator=generator)
    input_ids = torch.tensor([[1, 2, 3, 4, 0, 0], [1, 1, 2, 3, 4, 2]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    nll, count = token_nll(logits, input_ids, loss_mask)
    expected, expected_count = nll_by_hand(logits, input_ids, loss_mask)
    assert count == expected_count == 5
    assert float(nll) == pytest.approx(expected, rel=1e-6)
    # another prompt (tokens and the logits that predict them) changes nothing
    other_ids, other_logits = input_ids.clone(), logits.clone()
    other_ids[0, :2] = torch.tensor([4, 4])
    other_ids[1, :3] = torch.tensor([3, 0, 0])
    other_logits[0, [0, 4, 5]] = 100.0
    other_logits[1, [0, 1]] = -100.0
    assert float(token_nll(other_logits, other_ids, loss_mask)[0]) == pytest.approx(float(nll), rel=1e-6)


def test_token_nll_without_scored_tokens_is_zero_not_nan():
    logits = torch.randn(2, 4, 5, requires_grad=True)
    mask = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)  # position 0 is never scored
    nll, count = token_nll(logits, torch.zeros(2, 4, dtype=torch.long), mask)
    assert count == 0 and float(nll.detach()) == 0.0
    nll.backward()
    assert not logits.grad.isnan().any()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_token_nll_counts_exactly_the_response_tokens(lengths, seed):
    """Through collate_sft: any prompt/response lengths, the count is the number of response tokens."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 9, (p,), generator=generator).tolist() for p, _ in lengths]
    responses = [torch.randint(4, 9, (r - 1,), generator=generator).tolist() + [3] for _, r in lengths]
    batch = collate_sft(prompts, responses, pad_id=0)
    logits = torch.randn(*batch["input_ids"].shape, 9, generator=generator)
    nll, count = token_nll(logits, batch["input_ids"], batch["loss_mask"])
    expected, expected_count = nll_by_hand(logits, batch["input_ids"], batch["loss_mask"])
    assert count == expected_count == sum(r for _, r in lengths)
    assert float(nll) == pytest.approx(expected, rel=1e-5)


@torch.no_grad()
def test_model_token_nll_ignores_padding_side(tok):
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    batch = collate_sft([[5, 6], [7]], [[8, 9, 3], [10, 3]], pad_id=0)
    nll, count = model_token_nll(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
    alone = [
        model_token_nll(
            model,
            batch["input_ids"][i : i + 1, :n],
            batch["attention_mask"][i : i + 1, :n],
            batch["loss_mask"][i : i + 1, :n],
        )[0]
        for i, n in ((0, 5), (1, 3))
    ]
    assert count == 5
    assert float(nll) == pytest.approx(float(sum(alone)), rel=1e-5)


# -- the trainer -------------------------------------------------------------------------------
def test_run_sft_lowers_the_loss_and_saves_a_loadable_model(tok, tmp_path):
    config = sft_config(tmp_path)
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    final = run_sft(config, model=model, tokenizer=tok, quiet=True)
    run = tmp_path / "sft"
    baseline, *rows = log_rows(run)
    assert baseline["step"] == 0 and not any(k.startswith("train/") for k in baseline)
    assert [r["step"] for r in rows] == list(range(12))
    losses = [r["train/loss"] for r in rows]
    assert losses[-1] < 0.5 * losses[0]
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [5, 11]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    for r in evals:
        assert r["eval/ppl"] == pytest.approx(torch.tensor(r["eval/loss"]).exp().item(), rel=1e-5)
        assert r["eval/ppl"] >= 1 and r["eval/tokens"] == 6 * 4  # 6 held-out examples, 3 words + EOS
    assert final["eval/loss"] == evals[-1]["eval/loss"]
    assert (run / "config.yaml").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(run)
    loaded_tok = AutoTokenizer.from_pretrained(run)
    assert loaded_tok.get_vocab() == tok.get_vocab()
    for name, param in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], param), name


def test_run_sft_fills_every_batch_when_the_data_is_smaller(tok, tmp_path):
    config = sft_config(tmp_path, train={"max_steps": 2, "batch_size": 8})
    rows = [EncodedSFT([5, 6], [7, 8, tok.eos_token_id]) for _ in range(3)]  # 3 rows, batches of 8
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    run_sft(config, model=model, tokenizer=tok, train_rows=rows, test_rows=rows[:1], quiet=True)
    assert [r["train/tokens"] for r in log_rows(tmp_path / "sft") if "train/loss" in r] == [8 * 3, 8 * 3]


def test_run_sft_uses_the_given_test_rows(tok, tmp_path):
    config = sft_config(tmp_path, train={"max_steps": 1})
    held_out = [EncodedSFT([5], [6, tok.eos_token_id])]
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    final = run_sft(config, model=model, tokenizer=tok, test_rows=held_out, quiet=True)
    assert final["eval/tokens"] == 2


def test_run_sft_evaluates_the_untrained_model_first(tok, tmp_path):
    config = sft_config(tmp_path)
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    untouched = copy.deepcopy(model)
    final = run_sft(config, model=model, tokenizer=tok, quiet=True)
    baseline = log_rows(tmp_path / "sft")[0]
    assert baseline["eval/tokens"] == 6 * 4  # 6 held-out rows of 3 words + EOS
    # the reference: the token-mean NLL of the untouched model on the same held-out rows
    from rlhf.data.loading import load_examples, split_examples
    from rlhf.data.tokenize import TruncationStats
    from rlhf.stages.sft import encode_sft_examples, sft_batch

    _, test_ex = split_examples(load_examples(config.data.path, kind="sft").examples, 0.25, seed=config.seed)
    rows = encode_sft_examples(tok, test_ex, config, TruncationStats())
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            batch = sft_batch([row], tok.pad_token_id)
            value, n = model_token_nll(
                untouched, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
            )
            nll, count = nll + float(value), count + n
    assert baseline["eval/loss"] == pytest.approx(nll / count, rel=1e-5)
    assert baseline["eval/ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert final["eval/loss_before_training"] == baseline["eval/loss"] > final["eval/loss"]


def test_the_baseline_evaluation_leaves_training_unchanged(tok, tmp_path):
    """Evaluation draws no random numbers: a run with held-out rows trains exactly like one without
    (attention dropout on, so that training itself draws from the global generator)."""
    train = [EncodedSFT([5 + i % 4, 6], [7 + i % 3, 8, tok.eos_token_id]) for i in range(12)]
    held_out = [EncodedSFT([6, 5], [9, tok.eos_token_id])]
    runs = {}
    for name, test_rows in (("with", held_out), ("without", [])):
        config = sft_config(tmp_path, out=str(tmp_path / name), train={"max_steps": 4, "batch_size": 4})
        model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
        for module in model.modules():
            if hasattr(module, "attention_dropout"):
                module.attention_dropout = 0.5
        run_sft(config, model=model, tokenizer=tok, train_rows=train, test_rows=test_rows, quiet=True)
        runs[name] = (
            model.state_dict(),
            [r["train/loss"] for r in log_rows(tmp_path / name) if "train/loss" in r],
        )
    assert runs["with"][1] == runs["without"][1]
    for key, value in runs["with"][0].items():
        assert torch.equal(value, runs["without"][0][key]), key


def test_run_sft_with_lora_saves_merged_weights(tok, tmp_path):
    config = sft_config(tmp_path, train={"max_steps": 3}, lora={"enabled": True, "r": 4})
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_sft(config, model=model, tokenizer=tok, quiet=True)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert set(loaded.state_dict()) == set(before)  # plain weights, no adapter keys
    assert any(not torch.equal(loaded.state_dict()[k], v) for k, v in before.items())


def test_sft_into_a_used_run_directory_stops_before_writing(tok, tmp_path):
    config = sft_config(tmp_path, train={"max_steps": 1})
    run_sft(
        config,
        model=tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2),
        tokenizer=tok,
        quiet=True,
    )
    before = {p.name: p.read_bytes() for p in (tmp_path / "sft").iterdir() if p.is_file()}
    changed = sft_config(tmp_path, train={"max_steps": 2})
    with pytest.raises(ConfigError, match="already has metrics.jsonl: use another --out"):
        run_sft(
            changed,
            model=tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2),
            tokenizer=tok,
            quiet=True,
        )
    assert {p.name: p.read_bytes() for p in (tmp_path / "sft").iterdir() if p.is_file()} == before


def test_run_sft_without_training_rows_stops(tok, tmp_path):
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="no training SFT examples"):
        run_sft(sft_config(tmp_path), model=model, tokenizer=tok, train_rows=[], quiet=True)


def test_run_sft_records_the_share_of_truncated_prompts(tok, tmp_path):
    k = len(WORDS)  # prompt i has 1 + i % 3 words: 8 of 24 have 3 and lose one to a 2-token budget
    rows = [
        {"prompt": " ".join(WORDS[(i + j) % k] for j in range(1 + i % 3)), "response": WORDS[(i + 3) % k]}
        for i in range(24)
    ]
    config = sft_config(
        tmp_path,
        data={"path": str(write_jsonl(tmp_path / "mixed.jsonl", rows)), "max_prompt_tokens": 2},
        train={"max_steps": 2},
    )
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    final = run_sft(config, model=model, tokenizer=tok, quiet=True)
    last = log_rows(tmp_path / "sft")[-1]
    for figures in (final, last):  # the summary's figures, and metrics.jsonl's last record
        assert figures["data/prompts"] == 24 and figures["data/prompts_truncated"] == 8
        assert figures["data/prompts_truncated_share"] == pytest.approx(1 / 3)
    assert sum("data/prompts" in r for r in log_rows(tmp_path / "sft")) == 1  # recorded once


def test_an_sft_step_with_nan_gradients_is_skipped_and_warned(tok, tmp_path):
    config = sft_config(tmp_path, train={"max_steps": 3, "micro_batch_size": 8, "eval_every": 0})
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    calls = {"n": 0}

    def second_step_nan(grad):  # one micro-batch per step: the second step's gradient is NaN
        calls["n"] += 1
        return torch.full_like(grad, float("nan")) if calls["n"] == 2 else grad

    model.lm_head.weight.register_hook(second_step_nan)
    run_sft(config, model=model, tokenizer=tok, quiet=True)
    rows = [r for r in log_rows(tmp_path / "sft") if "train/loss" in r]
    assert [r["train/skipped_step_fraction"] for r in rows] == [0.0, 1.0, 0.0]
    assert "train/grad_norm" not in rows[1] and math.isfinite(rows[2]["train/grad_norm"])
    warned = [r for r in log_rows(tmp_path / "sft") if r.get("event") == "warning"]
    assert [w["step"] for w in warned] == [1] and "skipped" in warned[0]["message"]
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
