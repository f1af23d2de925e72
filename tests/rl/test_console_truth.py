"""A run tells the truth on its console: each phase counted in its own units with the
part of a step under way named, a policy that does not move reported once with the fix (and as an
event in metrics.jsonl), the KL led by a non-negative estimate, and what the run directory keeps."""

from __future__ import annotations

import copy
import json
import shutil

from rlhf.monitor.stillness import (
    CODE,
    STILL_KL,
    STILL_POLICY_ITERATIONS,
    STILL_RATIO,
    StillPolicyCheck,
    is_still,
)
from rlhf.rl.monitors import warmup_iterations
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.rundir.footprint import footprint_line, human_bytes
from rlhf.runtime import LocalRuntime
from rlhf.stages.train import kl_first
from tests.support.train_testing import rl_config


def train_with_console(tok, prompts, _models, tmp_path, config):
    policy, reward_model = copy.deepcopy(_models)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    trainer = RLTrainer(
        config, LocalRuntime(roles, config.runtime), prompts, run_dir=tmp_path / "run"
    )  # not quiet: the console too
    trainer.train()
    return trainer


def events(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == "warning"]


def test_each_phase_counts_its_own_units_and_a_step_names_its_part(tok, prompts, _models, tmp_path, capsys):
    config = rl_config(
        "ppo_max",
        train={"iterations": 3, "minibatches": 1},
        critic={"pretrain_iterations": 2, "pretrain_patience": 5},
        log={"sinks": ["console", "jsonl"]},
        policy_optim={"warmup_fraction": 0.0},
    )
    train_with_console(tok, prompts, _models, tmp_path, config)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[run]")]
    # before: "pretrain 0/3" (the run's iteration count), and the last line "iteration 2/3 (67%)"
    assert not any("pretrain 0/" in line or "pretrain 1/3" in line for line in lines), lines
    heads = [line.split(" |")[0] for line in lines]
    assert heads[:5] == [
        "[run] pretrain 1/2: sampling ...",
        "[run] pretrain 1/2: scoring ...",
        "[run] pretrain 1/2: forwards ...",
        "[run] pretrain 1/2: updating the critic ...",
        "[run] pretrain 1/2 (50%)",
    ]
    assert "[run] pretrain 2/2 (100%)" in heads
    first = heads.index("[run] iteration 1/3: sampling ...")
    assert heads[first : first + 5] == [
        "[run] iteration 1/3: sampling ...",
        "[run] iteration 1/3: scoring ...",
        "[run] iteration 1/3: forwards ...",
        "[run] iteration 1/3: updating ...",
        "[run] iteration 1/3 (33%)",
    ]
    assert heads[-1] == "[run] iteration 3/3 (100%)"
    assert not any(": sampling" in h for h in heads[first + 5 :])  # later, short steps: no status lines
    assert "kl/k3" in lines[-1] and "kl/ref" not in lines[-1]  # the console leads with k3 (>= 0)


def test_a_policy_that_does_not_move_is_reported_once_with_the_fix(tok, prompts, _models, tmp_path, capsys):
    iterations = STILL_POLICY_ITERATIONS + 1
    config = rl_config(
        "vanilla_ppo", train={"iterations": iterations}, policy_optim={"lr": 1e-12, "warmup_fraction": 0.0}
    )
    config.log.sinks = ["console", "jsonl"]
    train_with_console(tok, prompts, _models, tmp_path, config)
    warned = [e for e in events(tmp_path / "run") if e.get("code") == CODE]
    assert len(warned) == 1  # once, not at every iteration after
    assert warned[0]["iteration"] == STILL_POLICY_ITERATIONS - 1
    assert (
        "policy_optim.lr 1e-12" in warned[0]["message"] and "raise --policy_optim.lr" in warned[0]["message"]
    )
    assert "has not moved" in capsys.readouterr().out


def test_a_policy_that_moves_is_not_reported(make_trainer, tmp_path):
    config = rl_config(
        "vanilla_ppo", train={"iterations": STILL_POLICY_ITERATIONS}, policy_optim={"lr": 1e-2}
    )
    trainer = make_trainer(config)
    trainer.train()
    assert not [e for e in events(trainer.run_dir) if e.get("code") == CODE]


def still(kl=0.0, ratio=1.0, approx=0.0):
    return {"kl/k3": kl, "policy/ratio_mean": ratio, "policy/approx_kl": approx}


def test_still_means_ratio_approx_kl_and_reference_kl_all_at_rest():
    assert is_still(still()) is True
    assert is_still(still(kl=STILL_KL * 2)) is False
    assert is_still(still(ratio=1 + STILL_RATIO * 2)) is False
    assert is_still(still(approx=-STILL_KL * 2)) is False  # |approx KL|
    assert is_still({"kl/k3": 0.0}) is True  # a loss without ratio or approx KL (AWR) is judged on the KL
    assert is_still({"policy/ratio_mean": 1.0}) is None  # nothing to judge by


def test_the_check_waits_for_the_warmup_and_a_move_disarms_it():
    check = StillPolicyCheck(5e-7, lora=True, start=2, iterations=3)
    assert [check.update(i, still()) for i in range(4)] == [None] * 4  # 0, 1: warmup; 2, 3: still
    message = check.update(4, still())
    assert message and "LoRA adapter" in message and "5e-07" in message
    assert check.update(5, still()) is None  # once
    moved = StillPolicyCheck(1e-5, iterations=3)
    assert moved.update(0, still()) is None and moved.update(1, still(kl=0.1)) is None
    assert [moved.update(i, still()) for i in range(2, 9)] == [None] * 7


def test_warmup_iterations_follow_the_policy_schedule():
    config = rl_config("ppo_max", train={"iterations": 200, "minibatches": 4, "ppo_epochs": 1})
    assert warmup_iterations(config) == 20  # 10% of 800 optimizer steps, 4 a iteration
    assert warmup_iterations(rl_config("vanilla_ppo", policy_optim={"warmup_fraction": 0.0})) == 0


def test_the_summary_leads_the_kl_with_k3():
    shown = {"reward/raw_mean": 1.0, "kl/k1": -0.01, "kl/ref": -0.01, "kl/k3": 0.002, "kl/beta": 0.05}
    assert list(kl_first(shown)) == ["reward/raw_mean", "kl/k3", "kl/k1", "kl/ref", "kl/beta"]
    assert kl_first({"kl/ref": 0.1}) == {"kl/ref": 0.1}


def test_the_footprint_line_says_what_each_part_is_for(tmp_path):
    run = tmp_path / "run"
    for name, size in [
        ("checkpoints/iter_000002/model.safetensors", 3000),
        ("checkpoints/iter_000002/DONE", 10),
        ("checkpoints/iter_000004/model.safetensors", 3000),
        ("checkpoints/iter_000004/DONE", 10),
        ("model.safetensors", 2000),
        ("config.json", 100),
        ("tokenizer.json", 400),
        ("critic/model.safetensors", 500),
        ("critic/config.json", 100),
        ("metrics.jsonl", 50),
    ]:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(b"x" * size)
    line = footprint_line(run, keep=2)
    assert line.startswith(f"{run} keeps 9.2 KB: checkpoints/ 6.0 KB (2 kept, checkpoint.keep 2")
    assert "the exported model 3.1 KB" in line and "records 50 B" in line and "--resume" in line
    assert "\n" not in line
    for old in (run / "checkpoints").iterdir():  # a run without checkpoints (sft, rm): no such part
        shutil.rmtree(old)
    assert footprint_line(run, keep=0).startswith(f"{run} keeps 3.1 KB: the exported model 3.1 KB (")
    assert [human_bytes(n) for n in (999, 1500, 2.5e9)] == ["999 B", "1.5 KB", "2.5 GB"]


def test_a_critic_free_run_counts_only_iterations(tok, prompts, _models, tmp_path, capsys):
    config = rl_config("grpo", train={"iterations": 2}, log={"sinks": ["console", "jsonl"]})
    train_with_console(tok, prompts, _models, tmp_path, config)
    heads = [line.split(" |")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[run]")]
    assert heads[0] == "[run] iteration 1/2: sampling ..." and heads[-1] == "[run] iteration 2/2 (100%)"
    assert not any("pretrain" in h for h in heads)
