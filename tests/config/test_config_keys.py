"""Generated from the declarations (rlhf/config/keys.py) over every key of every stage: each numeric key
declares a range; a value just outside it and a non-finite one stop naming the key, its bound and a
fix; each declared condition, unmet while the key is set, stops naming the key and the condition. A
key added to a config is covered without editing this file. In-process (load_config), no stage runs;
a few cases go through `rlhf.cli.main` for the exit code and the message path."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

from rlhf.cli import main
from rlhf.config import ConfigError, deep_merge, load_config, parse_overrides
from rlhf.config.fields import choices, is_group, type_hints
from rlhf.config.keys import When, conditions, meeting, numeric_kind, spec_of
from rlhf.config.listing import render
from rlhf.config.stages import STAGE_CONFIGS

REQUIRED = {  # the keys a stage has no default for
    "eval": {"policy": "p", "baseline": "b", "judge": "j", "data": {"prompts": "x.jsonl"}},
    "rm-eval": {"reward_model": "rm", "data": {"path": "pairs.jsonl"}},
}


def leaves(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, typing.Any]]:
    """(dotted key, field, type) of every non-group field of `cls`, at every depth."""
    out = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        if is_group(hints[f.name]):
            out += leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f, hints[f.name]))
    return out


def flags(changes: dict) -> dict:
    return parse_overrides([f"--{k}={json.dumps(v)}" for k, v in changes.items()])


def refusal(stage: str, changes: dict) -> str | None:
    """The message of load_config(stage, REQUIRED + `changes` as command-line flags); None: accepted."""
    try:
        load_config(STAGE_CONFIGS[stage], overrides=deep_merge(REQUIRED.get(stage, {}), flags(changes)))
    except ConfigError as err:
        return str(err)
    return None


CASES = [(stage, key, f, tp) for stage, cls in STAGE_CONFIGS.items() for key, f, tp in leaves(cls)]


def test_every_numeric_key_declares_its_range():
    missing = [
        f"{stage} {key}"
        for stage, key, f, tp in CASES
        if numeric_kind(tp) is not None and spec_of(f).range is None
    ]
    assert missing == [], "numeric keys without a declared range (rlhf.config.keys.setting):\n" + "\n".join(
        missing
    )
    unbounded = [
        f"{stage} {key}"
        for stage, key, f, tp in CASES
        if spec_of(f).range is not None and spec_of(f).range.text == "any" and not spec_of(f).range.why
    ]
    assert unbounded == [], "a range of any number says why a number of either sign means something"


def test_every_range_refuses_a_value_just_outside_and_a_non_finite_one():
    failed, tried = [], 0
    for stage, key, f, tp in CASES:
        rng = spec_of(f).range
        if rng is None:
            continue
        integer = numeric_kind(tp) is int
        for value in [*rng.outside(integer), math.nan, math.inf, -math.inf]:
            tried += 1
            message = refusal(stage, {**meeting(STAGE_CONFIGS[stage], key), key: value})
            bound = rng.words() if rng.text != "any" else "finite"
            if message is None or key not in message or bound not in message or "Fix: --" not in message:
                failed.append(f"{stage} {key} {value}: {message}")
    assert tried > 300
    assert failed == [], f"{len(failed)} of {tried}:\n" + "\n".join(failed)


def unmet_value(cls: type, when: When, where: str) -> typing.Any:
    """A value of the condition's key that does not meet it (None: its default already does not)."""
    config = cls()
    node = config
    for part in where.split("."):
        node = getattr(node, part)
    if not when.holds(node):
        return None
    tp = dict((k, t) for k, _, t in leaves(cls))[where]
    for candidate in [*(choices(tp) or ()), False, True, "", 0, None]:
        if not when.holds(candidate):
            return candidate
    raise AssertionError(f"no value of {where} fails {when}")


def test_every_condition_refuses_its_key_set_without_it():
    failed, tried = [], 0
    for stage, key, _, _ in CASES:
        cls = STAGE_CONFIGS[stage]
        for when, prefix in conditions(cls, key):
            where = when.key if when.root else prefix + when.key
            # every other condition of the key met, this one not
            # (and none that this condition also governs: it would be refused first)
            changes = {
                k: v
                for k, v in meeting(cls, key).items()
                if k != where and when not in [w for w, _ in conditions(cls, k)]
            }
            off = unmet_value(cls, when, where)
            if off is not None:
                changes[where] = off
            default = cls()
            for part in key.split("."):
                default = getattr(default, part)
            tried += 1
            message = refusal(stage, {**changes, key: default})
            said = when.words(prefix)
            if message is None or f"{key} applies only when {said}" not in message or "Fix: " not in message:
                failed.append(f"{stage} {key} without {said}: {message}")
    assert tried > 60
    assert failed == [], f"{len(failed)} of {tried}:\n" + "\n".join(failed)


def test_a_preset_or_a_default_setting_a_key_that_does_not_apply_stays_silent():
    config = load_config(STAGE_CONFIGS["train"], preset="ppo_max", overrides={"advantage": {"estimator": "grpo"},
                         "rollout": {"samples_per_prompt": 2}})  # fmt: skip
    assert config.critic.pretrain_iterations == 10  # the preset's, for a critic the run does not build
    for stage, cls in STAGE_CONFIGS.items():
        load_config(cls, overrides=REQUIRED.get(stage))


def test_the_listing_shows_every_key_with_its_range_condition_and_doc():
    text = render("train")
    for key in ("kl.beta", "policy.is_truncation", "ray.rollout.num_actors", "env.max_turns"):
        assert key in text
    line = next(x for x in text.splitlines() if x.startswith("policy.is_truncation"))
    assert ">= 1" in line and "rollout.max_staleness > 0" in line and "decoupled PPO" in line
    assert "dist.runtime ray" in next(x for x in text.splitlines() if x.startswith("ray.address"))
    grpo = render("train", preset="grpo")
    assert any(x.startswith("rollout.samples_per_prompt") and "*int = 8" in x for x in grpo.splitlines())


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["dpo", "--model", "m", "--data", "d", "--kl.beta", "0.1"], ["kl.beta is a key of `rlhf train`, not of `rlhf dpo`"]),
        (["train", "--policy", "m", "--reward-model", "r", "--prompts", "p", "--ray.rollout.num_actors", "2"],
         ["ray.rollout.num_actors applies only when dist.runtime ray", "Fix: --dist.runtime ray"]),
        (["dpo", "--model", "m", "--data", "d", "--dpo.beta", "1e30"], ["dpo.beta must be in (0, 100]", "Fix: --dpo.beta 0.1"]),
    ],
)  # fmt: skip
def test_through_the_cli_exit_2_and_one_message(argv, words, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_rlhf_config_prints_the_listing(capsys):
    assert main(["config", "dpo"]) == 0
    out = capsys.readouterr().out
    assert "dpo.beta" in out and "(0, 100]" in out and "kl.beta" not in out
    assert main(["config", "dpo", "--preset", "grpo"]) == 2


def test_a_stage_help_names_its_groups_and_the_listing(capsys):
    with pytest.raises(SystemExit):
        main(["dpo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "config groups: data, train, optim, lora, dist, dpo, checkpoint" in out and "rlhf config dpo" in out
    )
