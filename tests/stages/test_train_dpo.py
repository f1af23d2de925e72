"""`rlhf dpo` (rlhf/stages/dpo.py) on tiny models: the loss starts at log 2 (the policy is its
reference), training separates the pairs, micro-batching and the reference cache change no number,
a LoRA policy's reference is its adapter switched off, every loss runs, SimPO builds no reference and
scores each response by its mean token log-prob (against a plain loop), and the command writes a
model and a DPO report (bad settings exit 2)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.cli import main
from rlhf.config import ConfigError, DPOConfig, load_config
from rlhf.models.loading import load_causal_lm
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.stages.dpo import DPOPair, DPOStage, pair_logprobs, run_dpo
from rlhf.train.supervised import run_supervised

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


def pairs(n: int = 40, seed: int = 0) -> list[dict]:
    """The chosen response ends with "t" before its EOS; the rejected one never holds a "t"."""
    g = torch.Generator().manual_seed(seed)
    plain = WORDS[:-1]

    def words(k: int) -> str:
        return " ".join(plain[i] for i in torch.randint(0, len(plain), (k,), generator=g).tolist())

    return [{"prompt": words(2), "chosen": words(2) + " t", "rejected": words(3)} for _ in range(n)]


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([" ".join(WORDS)])


def config(tmp_path, **dpo) -> DPOConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in pairs()))
    return load_config(
        DPOConfig,
        overrides={
            "out": str(tmp_path / "dpo"),
            "data": {"path": str(data), "test_fraction": 0.25},
            "train": {
                "max_steps": 16,
                "batch_size": 8,
                "micro_batch_size": 3,
                "eval_every": 8,
                "log_every": 1,
            },
            "optim": {"lr": 1e-2, "warmup_fraction": 0.0, "schedule": "constant"},
            "dpo": dpo,
            "sinks": ["jsonl"],
            "dtype": "float32",
        },
    )


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def model(tok, seed: int = 0):
    return tiny_causal_lm(tok, seed=seed, hidden_size=32, num_layers=1, num_heads=2)


def test_the_loss_starts_at_log_2_and_training_separates_the_pairs(tok, tmp_path):
    final = run_dpo(config(tmp_path), model=model(tok), tokenizer=tok, quiet=True)
    rows = [r for r in records(tmp_path / "dpo") if "train/loss" in r]
    # at step 0 the policy is its reference: every implicit reward is 0
    assert rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[0]["train/margin"] == pytest.approx(0.0, abs=1e-6) and rows[0]["train/accuracy"] == 0.0
    assert final["eval/accuracy"] >= 0.8 and final["eval/margin"] > 0.5
    assert final["train/loss"] < 0.5 * math.log(2)
    assert final["eval/chosen_reward"] > final["eval/rejected_reward"]
    exported = load_causal_lm(tmp_path / "dpo")  # a float32 Hugging Face directory
    assert next(exported.parameters()).dtype == torch.float32
    assert "DPO" in (tmp_path / "dpo" / "report.html").read_text()


@pytest.mark.parametrize(
    "change",
    [{"micro_batch_size": 8}, {"precompute_reference": False}, {"micro_batch_size": 8, "loss": "simpo"}],
)
def test_micro_batches_and_the_reference_cache_change_no_number(change, tok, tmp_path):
    loss = {"loss": change["loss"], "beta": 2.0} if "loss" in change else {}
    base = run_dpo(config(tmp_path / "a", **loss), model=model(tok), tokenizer=tok, quiet=True)
    cache = (
        {"precompute_reference": False} if "precompute_reference" in change else {}
    )  # simpo has no reference
    other = config(tmp_path / "b", **cache, **loss)
    other.train.micro_batch_size = change.get("micro_batch_size", 3)
    again = run_dpo(other, model=model(tok), tokenizer=tok, quiet=True)
    for key, value in base.items():
        if isinstance(value, float):
            assert again[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_a_lora_policys_reference_is_its_adapter_switched_off(tok, tmp_path):
    c = config(tmp_path)
    c.lora.enabled, c.lora.r, c.lora.target_modules = True, 4, ["q_proj", "v_proj"]
    stage = DPOStage(c)
    base = model(tok, seed=3)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    final = run_supervised(stage, model=base, tokenizer=tok, quiet=True)
    assert stage.reference.mode == "adapter"  # no second copy of the weights
    rows = [r for r in records(tmp_path / "dpo") if "train/loss" in r]
    assert rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-6)  # fresh adapters change nothing
    assert final["eval/margin"] > 0
    with stage.reference.in_force() as reference:  # the adapter off: the starting weights
        frozen = {
            n.replace("base_model.model.", "").replace(".base_layer", ""): p
            for n, p in reference.named_parameters()
            if "lora_" not in n
        }
    for name, value in before.items():
        torch.testing.assert_close(frozen[name], value, msg=name)


@pytest.mark.parametrize("loss,smoothing", [("ipo", 0.0), ("robust", 0.2), ("sigmoid", 0.1), ("simpo", 0.1)])
def test_every_loss_trains(loss, smoothing, tok, tmp_path):
    final = run_dpo(
        config(
            tmp_path,
            loss=loss,
            **({"label_smoothing": smoothing} if smoothing else {}),  # ipo has none
            **({"beta": 2.0} if loss == "simpo" else {}),
        ),
        model=model(tok),
        tokenizer=tok,
        quiet=True,
    )
    assert all(math.isfinite(v) for v in final.values() if isinstance(v, float))
    assert final["eval/margin"] > 0


def test_simpo_builds_no_reference_and_separates_the_pairs(tok, tmp_path):
    stage = DPOStage(config(tmp_path, loss="simpo", beta=2.0, simpo_gamma=0.5))
    final = run_supervised(stage, model=model(tok), tokenizer=tok, quiet=True)
    assert stage.reference is None  # no copy of the model, nothing scored before training
    rows = [r for r in records(tmp_path / "dpo") if "train/loss" in r]
    assert rows[0]["train/loss"] != pytest.approx(math.log(2), abs=1e-3)  # no reference: not DPO's log 2
    assert final["eval/accuracy"] >= 0.8 and final["eval/margin"] > 0.5
    assert final["eval/chosen_reward"] > final["eval/rejected_reward"]


def test_simpos_mean_token_logprobs_equal_a_plain_loop(tok):
    policy = model(tok, seed=4).eval()
    encoded = [
        DPOPair(tok(r["prompt"])["input_ids"], tok(r["chosen"])["input_ids"], tok(r["rejected"])["input_ids"])
        for r in pairs(n=3, seed=2)
    ]
    encoded[1].rejected_ids = encoded[1].rejected_ids[:1]  # a one-token response
    with torch.no_grad():
        chosen, rejected = pair_logprobs(policy, encoded, tok.pad_token_id, None, per_token=True)
        summed, _ = pair_logprobs(policy, encoded, tok.pad_token_id, None)
        for i, pair in enumerate(encoded):
            for response, got in ((pair.chosen_ids, chosen[i]), (pair.rejected_ids, rejected[i])):
                ids = torch.tensor([pair.prompt_ids + response])
                logp = torch.log_softmax(policy(ids).logits[0].double(), -1)
                start = len(pair.prompt_ids)
                total = sum(logp[start + k - 1, token].item() for k, token in enumerate(response))
                assert got.item() == pytest.approx(total / len(response), rel=1e-5, abs=1e-6)
            assert summed[i].item() == pytest.approx(chosen[i].item() * len(pair.chosen_ids), rel=1e-5)


@pytest.mark.parametrize(
    "dpo,key",
    [
        ({"loss": "simpo", "simpo_gamma": -0.5}, "dpo.simpo_gamma"),
        ({"loss": "robust", "label_smoothing": 0.5}, "dpo.label_smoothing"),
        ({"loss": "ipo", "label_smoothing": 0.1}, "dpo.label_smoothing"),
        ({"beta": 0.0}, "dpo.beta"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(dpo, key, tmp_path):
    with pytest.raises(ConfigError, match=rf"{key} .*Fix: .*--{key}"):
        config(tmp_path, **dpo)


@pytest.mark.slow
def test_the_command_trains_exports_and_reports_and_a_bad_loss_exits_2(tmp_path, capsys):
    from tests.support.cli_data import save_tiny_base, write_jsonl

    save_tiny_base(tmp_path / "base", WORDS)
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs())
    args = ["dpo", "--model", str(tmp_path / "base"), "--data", data, "--train.max_steps", "4",
            "--train.batch_size", "8", "--sinks", "jsonl"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "model.safetensors").is_file() and (tmp_path / "run" / "report.html").is_file()
    assert "DPO finished" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "bad"), "--dpo.loss", "kto"]) == 2
    assert "dpo.loss" in capsys.readouterr().err and not (tmp_path / "bad").exists()
