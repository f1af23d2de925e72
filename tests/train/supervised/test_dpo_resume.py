"""`rlhf dpo --resume` (rlhf/train/supervised/checkpoint.py): a run interrupted after a checkpoint and
resumed writes the same metrics, step for step, as the run that was never interrupted (weights,
AdamW moments, schedule, data order, RNG states and the reference cache all restored); the resume
refuses what would make it another run, and the command continues a run it was told to."""

from __future__ import annotations

import json

import pytest

from rlhf.cli import main
from rlhf.config import ConfigError, DPOConfig, load_config
from rlhf.models.tiny import word_tokenizer
from rlhf.rundir.supervised_resume import supervised_resume_config
from rlhf.stages.dpo import DPOStage, run_dpo
from tests.stages.test_train_dpo import WORDS, model, pairs, records

TOLERANCE = 1e-6  # absolute, on every logged float; on a CPU the two runs agree to the last bit


def dpo_config(tmp_path, **changes) -> DPOConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in pairs()))
    overrides = {
        "out": str(tmp_path / "dpo"),
        "data": {"path": str(data), "test_fraction": 0.25},
        "train": {
            "max_steps": 12,
            "batch_size": 8,
            "micro_batch_size": 3,
            "eval_every": 4,
            "log_every": 1,
            "group_by_length": "across_steps",  # the data order draws from the generator too
        },
        "optim": {"lr": 1e-2, "warmup_fraction": 0.25, "schedule": "linear"},  # a schedule to restore
        "checkpoint": {"every": 3, "keep": 2},
        "sinks": ["jsonl"],
        "dtype": "float32",
    }
    for key, value in changes.items():
        group, name = key.split(".")
        overrides.setdefault(group, {})[name] = value
    if not overrides["checkpoint"]["every"]:  # no checkpoints: none to keep
        del overrides["checkpoint"]["keep"]
    return load_config(DPOConfig, overrides=overrides)


def interrupt_at(monkeypatch, call: int) -> None:
    """Ctrl-C in the `call`-th training step (1-based)."""
    calls = {"n": 0}
    step = DPOStage.train_step

    def train_step(self, run, rows):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return step(self, run, rows)

    monkeypatch.setattr(DPOStage, "train_step", train_step)


def step_records(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in records(run_dir) if "step" in r and "event" not in r}


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        {},  # every weight trained, the reference's log-probs cached
        # LoRA adapters with dropout (the torch RNG matters) and the reference run in every step
        {"lora.enabled": True, "lora.r": 4, "lora.dropout": 0.2, "dpo.precompute_reference": False},
    ],
    ids=["full-cached", "lora-dropout-uncached"],
)
def test_an_interrupted_and_resumed_run_logs_the_same_metrics(changes, tok, tmp_path, monkeypatch):
    whole = run_dpo(dpo_config(tmp_path / "a", **changes), model=model(tok), tokenizer=tok, quiet=True)

    c = dpo_config(tmp_path / "b", **changes)
    with monkeypatch.context() as patch:
        interrupt_at(patch, 11)  # steps 0..9 done (checkpoints after 3, 6, 9), killed in step 10
        with pytest.raises(KeyboardInterrupt):
            run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)
    run_dir = tmp_path / "b" / "dpo"
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["iter_000006", "iter_000009"]  # checkpoint.keep 2
    assert max(step_records(run_dir)) == 9

    resumed = run_dpo(c, model=model(tok), tokenizer=tok, quiet=True, resume=True)

    expected, got = step_records(tmp_path / "a" / "dpo"), step_records(run_dir)
    assert sorted(got) == sorted(expected) == list(range(12))  # no step twice, none missing
    for step, record in expected.items():
        assert set(got[step]) == set(record), step
        for key, value in record.items():
            if isinstance(value, float):
                assert got[step][key] == pytest.approx(value, abs=TOLERANCE), (step, key)
    assert resumed["eval/accuracy"] == pytest.approx(whole["eval/accuracy"], abs=TOLERANCE)
    assert (run_dir / "model.safetensors").is_file()


def test_the_reference_cache_comes_from_the_checkpoint(tok, tmp_path, monkeypatch):
    c = dpo_config(tmp_path, **{"train.max_steps": 4, "checkpoint.every": 2})
    with monkeypatch.context() as patch:
        interrupt_at(patch, 4)
        with pytest.raises(KeyboardInterrupt):
            run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)
    scored = []
    monkeypatch.setattr(DPOStage, "cache_reference", lambda self, run, rows: scored.append(len(rows)))
    run_dpo(c, model=model(tok), tokenizer=tok, quiet=True, resume=True)
    assert scored == []  # no reference forward over the pairs again


def test_a_resume_refuses_other_data_and_other_settings(tok, tmp_path, monkeypatch):
    c = dpo_config(tmp_path, **{"train.max_steps": 4, "checkpoint.every": 2})
    with monkeypatch.context() as patch:
        interrupt_at(patch, 4)
        with pytest.raises(KeyboardInterrupt):
            run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)
    run_dir = tmp_path / "dpo"
    with pytest.raises(ConfigError, match=r"dpo.beta .*checkpoint.every"):
        supervised_resume_config(DPOConfig, run_dir, stage="dpo", overrides={"dpo": {"beta": 0.5}})
    allowed = supervised_resume_config(DPOConfig, run_dir, stage="dpo", overrides={"train": {"log_every": 2}})
    assert allowed.train.log_every == 2 and allowed.out == str(run_dir)
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs(seed=1)))
    with pytest.raises(ConfigError, match="pairs differ"):
        run_dpo(c, model=model(tok), tokenizer=tok, quiet=True, resume=True)


def test_without_a_checkpoint_the_resume_says_how_to_save_one(tok, tmp_path):
    c = dpo_config(tmp_path, **{"train.max_steps": 2, "checkpoint.every": 0})
    run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)
    with pytest.raises(ConfigError, match="checkpoint.every"):
        run_dpo(c, model=model(tok), tokenizer=tok, quiet=True, resume=True)
    with pytest.raises(ConfigError, match="--resume"):  # a fresh run into it offers the resume
        run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)


def test_fsdp2_checkpoints_are_accepted_by_the_config():
    """Each rank writes its shards (tests/runtime/test_distributed.py resumes them at 2 ranks and 1)."""
    config = load_config(DPOConfig, overrides={"checkpoint": {"every": 5}, "dist": {"strategy": "fsdp2"}})
    assert config.checkpoint.every == 5 and config.dist.strategy == "fsdp2"


@pytest.mark.slow
def test_the_command_names_the_resume_and_resumes(tmp_path, monkeypatch, capsys):
    from tests.support.cli_data import save_tiny_base, write_jsonl

    save_tiny_base(tmp_path / "base", WORDS)
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs())
    run = tmp_path / "run"
    args = ["dpo", "--model", str(tmp_path / "base"), "--data", data, "--out", str(run), "--train.max_steps",
            "6", "--train.batch_size", "8", "--train.log_every", "1", "--checkpoint.every", "2", "--sinks", "jsonl"]  # fmt: skip
    with monkeypatch.context() as patch:
        interrupt_at(patch, 4)  # killed in step 3, after the checkpoint of steps 0 and 1
        assert main(args) == 130
    assert f"rlhf dpo --resume {run}" in capsys.readouterr().err
    assert main(["dpo", "--resume", str(run), "--dpo.beta", "0.5"]) == 2  # another run: refused
    assert "dpo.beta" in capsys.readouterr().err
    assert main(["dpo", "--resume", str(run), "--train.eval_every", "3"]) == 0
    assert sorted(step_records(run)) == [0, 1, 2, 3, 4, 5]
    assert (run / "model.safetensors").is_file() and "DPO finished" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([" ".join(WORDS)])
