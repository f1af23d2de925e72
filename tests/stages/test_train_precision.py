"""SFT, reward-model training and eval under a device and a precision policy (on the CPU here;
tests/gpu repeats the device part on CUDA): bfloat16 trains, exports stay float32, gradient
checkpointing changes no number, and a device this machine lacks is a config error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhf.cli import main
from rlhf.config import ConfigError, RewardConfig, SFTConfig, load_config
from rlhf.evaluation.judging import reward_model_judge, score_policy
from rlhf.models.precision import Precision
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.rm import run_reward_training
from rlhf.stages.sft import run_sft
from tests.stages.test_train_reward_model import marker_pairs, reward_model
from tests.stages.test_train_sft import log_rows, sft_config
from tests.support.train_testing import write_jsonl


def output_dtypes(module: torch.nn.Module) -> list[torch.dtype]:
    """Record the dtype of every output of `module` from now on."""
    seen: list[torch.dtype] = []
    module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    return seen


def saved_dtypes(directory) -> set[torch.dtype]:
    return {t.dtype for t in load_file(str(directory / "model.safetensors")).values()}


def rm_overrides(tmp_path, train: dict | None = None, **top) -> RewardConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_config(
        RewardConfig,
        overrides={
            "out": str(tmp_path / "rm"),
            "data": {
                "path": str(write_jsonl(tmp_path / "pairs.jsonl", marker_pairs(32))),
                "test_fraction": 0.25,
            },
            "train": {
                "max_steps": 12,
                "batch_size": 8,
                "micro_batch_size": 4,
                "eval_every": 6,
                "log_every": 1,
                "lm_coef": 0.5,
                **(train or {}),
            },
            "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"},
            "sinks": ["jsonl"],
            **top,
        },
    )


# -- SFT ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat16-pure"])
def test_sft_in_bfloat16_lowers_the_loss_and_exports_float32(dtype, tok, tmp_path):
    config = sft_config(tmp_path, dtype=dtype, train={"max_steps": 8, "eval_every": 8})
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    head_outputs = output_dtypes(model.lm_head)
    weight_dtypes = []
    model.lm_head.register_forward_hook(lambda m, _i, _o: weight_dtypes.append(m.weight.dtype))
    run_sft(config, model=model, tokenizer=tok, quiet=True)
    losses = [
        r["train/loss"] for r in log_rows(tmp_path / "sft") if "train/loss" in r
    ]  # not the step-0 baseline eval
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    assert set(head_outputs) == {torch.bfloat16}  # every forward computed in bfloat16
    master = torch.float32 if dtype == "bfloat16" else torch.bfloat16
    assert set(weight_dtypes) == {master}  # weights stored as the policy says while training
    assert saved_dtypes(tmp_path / "sft") == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_sft_in_float32_runs_no_bfloat16_and_auto_is_float32_on_the_cpu(tok, tmp_path):
    assert Precision.resolve(SFTConfig().dtype, torch.device("cpu")).name == "float32"
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    head_outputs = output_dtypes(model.lm_head)
    run_sft(sft_config(tmp_path, train={"max_steps": 2}), model=model, tokenizer=tok, quiet=True)
    assert set(head_outputs) == {torch.float32}


def test_sft_with_gradient_checkpointing_logs_the_same_numbers(tok, tmp_path):
    runs = {}
    for on in (False, True):
        (tmp_path / str(on)).mkdir()
        config = sft_config(tmp_path / str(on), gradient_checkpointing=on, train={"max_steps": 4})
        model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2)
        recomputed = []  # runs of the first MLP (module hooks do not fire in transformers' recompute)
        mlp = model.model.layers[0].mlp
        mlp.forward = lambda *a, _f=mlp.forward, _n=recomputed, **k: _n.append(1) or _f(*a, **k)
        run_sft(config, model=model, tokenizer=tok, quiet=True)
        runs[on] = (log_rows(tmp_path / str(on) / "sft"), len(recomputed))
    (plain, plain_calls), (checkpointed, checkpointed_calls) = runs[False], runs[True]
    train_micro_batches = 4 * 3  # 4 steps of 8 examples in micro-batches of 3
    assert checkpointed_calls - plain_calls == train_micro_batches
    for a, b in zip(plain, checkpointed):
        for key in ("train/loss", "train/grad_norm", "eval/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


# -- reward model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat16-pure"])
def test_reward_model_in_bfloat16_lowers_the_loss_with_a_float32_head_and_export(dtype, tok, tmp_path):
    config = rm_overrides(tmp_path, dtype=dtype)
    model = reward_model(tok)
    trunk_outputs = output_dtypes(model.causal_lm.model.layers[0].mlp.down_proj)
    final = run_reward_training(config, model=model, tokenizer=tok, quiet=True)
    rows = [r for r in log_rows(tmp_path / "rm") if "train/loss" in r]
    assert len(rows) == 12
    first, last = sum(r["train/loss"] for r in rows[:3]), sum(r["train/loss"] for r in rows[-3:])
    assert last < 0.8 * first
    assert set(trunk_outputs) == {torch.bfloat16}
    assert model.head.weight.dtype == torch.float32
    trunk = {p.dtype for n, p in model.named_parameters() if not n.startswith("head.")}
    assert trunk == {torch.float32 if dtype == "bfloat16" else torch.bfloat16}
    assert saved_dtypes(tmp_path / "rm") == {torch.float32}
    assert load_file(str(tmp_path / "rm" / "scalar_head.safetensors"))["weight"].dtype == torch.float32
    assert final["best_step"] >= 0 and isinstance(final["train/loss"], float)


@pytest.mark.slow
def test_reward_model_with_gradient_checkpointing_logs_the_same_numbers(tok, tmp_path):
    logged = {}
    for on in (False, True):
        config = rm_overrides(
            tmp_path / str(on),
            gradient_checkpointing=on,
            train={"max_steps": 3, "eval_every": 3},
        )
        run_reward_training(config, model=reward_model(tok), tokenizer=tok, quiet=True)
        logged[on] = log_rows(tmp_path / str(on) / "rm")
    for a, b in zip(logged[False], logged[True]):
        for key in ("train/loss", "train/grad_norm", "eval/accuracy", "eval/margin_mean"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


# -- configuration and errors ---------------------------------------------------------------------


def test_dtype_choices_are_checked_when_the_config_is_read():
    with pytest.raises(
        ConfigError, match=r"dtype must be one of 'auto', 'float32', 'bfloat16', 'bfloat16-pure'"
    ):
        load_config(SFTConfig, overrides={"dtype": "float16"})
    from rlhf.config import RLConfig

    with pytest.raises(ConfigError, match=r"command line: dtype must be one of .*, got 'half'"):
        load_config(RLConfig, overrides={"dtype": "half"})
    rl = load_config(RLConfig, overrides={"dtype": "bfloat16", "model": {"gradient_checkpointing": True}})
    assert (rl.dtype, rl.model.gradient_checkpointing, rl.train.device) == ("bfloat16", True, "auto")


def test_a_missing_cuda_device_stops_sft_before_the_run_directory_is_made(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = sft_config(tmp_path, train={"device": "cuda"})
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    with pytest.raises(ConfigError, match=r"train\.device is 'cuda'.*Fix: set train\.device to cpu"):
        run_sft(config, model=model, tokenizer=tok, quiet=True)
    assert not (tmp_path / "sft").exists()


def test_cli_sft_with_a_missing_cuda_device_exits_2_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    data = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "response": "b"}])
    (tmp_path / "model").mkdir()
    code = main(
        [
            "sft",
            "--model",
            str(tmp_path / "model"),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o"),
            "--train.device",
            "cuda:1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert (
        "train.device is 'cuda:1'" in err and "Fix: set train.device to cpu" in err and "Traceback" not in err
    )


# -- eval -----------------------------------------------------------------------------------------


def test_eval_samples_and_judges_under_the_precision_and_returns_float32_cpu_scores(tok):
    from rlhf.models.sampling import SamplingConfig

    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    judge_model = reward_model(tok)
    policy_dtypes = output_dtypes(policy.model.layers[0].mlp.down_proj)
    judge_dtypes = output_dtypes(judge_model.causal_lm.model.layers[0].mlp.down_proj)
    prompts = [tok(t)["input_ids"] for t in ("a b", "c d e", "f")]
    greedy = SamplingConfig(max_new_tokens=4, do_sample=False)
    results = {}
    for name in ("float32", "bfloat16"):
        policy_dtypes.clear()
        judge_dtypes.clear()
        precision = Precision.resolve(name, torch.device("cpu"))
        judge = reward_model_judge(judge_model, precision=precision)
        scores, _, rollouts = score_policy(
            policy, tok, prompts, lambda s, e, j=judge: j, greedy, seed=0, precision=precision
        )
        results[name] = scores, rollouts
        expected = precision.compute_dtype
        assert set(policy_dtypes) == {expected} and set(judge_dtypes) == {expected}, name
        assert scores.dtype == torch.float32 and scores.device.type == "cpu" and scores.shape == (3,), name
    # the bfloat16 judge's scores are a float32 scoring of the same rollout, to bfloat16 rounding
    scores, (rollout,) = results["bfloat16"]  # one batch of 3 prompts
    with torch.no_grad():
        exact = judge_model.score(rollout.input_ids, rollout.attention_mask)
    torch.testing.assert_close(scores, exact, rtol=0, atol=0.05)
    assert not torch.equal(scores, exact)


def test_cli_eval_takes_device_and_dtype(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["eval", "--policy", "p", "--baseline", "b", "--judge", "j", "--prompts", "x.jsonl"]
    assert main([*args, "--device", "cuda"]) == 2
    assert "device is 'cuda'" in capsys.readouterr().err
    assert main([*args, "--device", "cpu", "--dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "dtype must be one of 'auto', 'float32', 'bfloat16', 'bfloat16-pure', got 'fp8'" in err
    assert "Fix: --dtype auto" in err


def test_cli_eval_in_bfloat16_writes_its_results(tok, tmp_path, capsys):
    policy = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    for name in ("policy", "baseline"):
        policy.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    judge = reward_model(tok)
    judge.save_pretrained(tmp_path / "rm")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "a b"}, {"prompt": "c"}])
    out = tmp_path / "eval.json"
    code = main(
        ["eval", "--policy", str(tmp_path / "policy"), "--baseline", str(tmp_path / "baseline"),
         "--judge", str(tmp_path / "rm"), "--prompts", str(prompts), "--out", str(out),
         "--max-new-tokens", "3", "--device", "cpu", "--dtype", "bfloat16"]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    # the same model and seed on both sides: every pair ties
    assert result["comparison"]["tie"] == 1.0 and result["policy"]["n"] == 2


# -- random state in checkpoints ------------------------------------------------------------------


def test_rng_state_holds_cuda_only_when_cuda_is_in_use(monkeypatch):
    from rlhf.rundir.checkpoint import rng_state, set_rng_state

    assert "cuda" not in rng_state()  # no CUDA here (tests/gpu checks the round trip on a GPU)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.tensor([1]), torch.tensor([2])])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, index: restored.append((int(state), index))
    )
    state = rng_state()
    assert [int(s) for s in state["cuda"]] == [1, 2]
    set_rng_state(state)
    assert restored == [(1, 0)]  # the devices both machines have
