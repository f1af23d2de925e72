"""Generated: every config field of every command (walked from the dataclasses) and every typed flag
of the commands without a config (walked from argparse) given a value of the wrong type and an
out-of-range one. Each must end with exit 2, no traceback, one message naming the key, before any
model loads (`preflight` (rlhf/rundir/preflight.py), reached only by a valid config, is replaced by a stop)."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

import rlhf.cli as cli
from rlhf.cli.flags import scalar
from rlhf.config import DPOConfig, EvalConfig, RewardConfig, RLConfig, RMEvalConfig, SFTConfig
from rlhf.config.fields import choices, is_group, type_hints

# Numeric fields where a negative value means something (an offset, a seed, a signed bound): only the
# wrong-type case applies. Every entry says why.
SIGNED_OK = {
    "seed": "any integer seeds the generators",
    "reward.shift": "a score offset",
    "reward.clip_low": "a lower bound on the score",
    "reward.min": "a lower bound on the score",
    "rollout.truncation_penalty": "the score of a truncated response, usually negative",
    "reward.model_weight": "a weight of the score sum; negative turns the score into a penalty",
}

STAGES = {  # command -> (config class, the arguments of a run that reaches the config checks)
    "sft": (SFTConfig, ["--model", "M", "--data", "D"]),
    "rm": (RewardConfig, ["--model", "M", "--data", "D"]),
    "dpo": (DPOConfig, ["--model", "M", "--data", "D"]),
    "train": (RLConfig, ["--policy", "M", "--reward-model", "R", "--prompts", "P"]),
    "eval": (EvalConfig, ["--policy", "M", "--baseline", "B", "--judge", "J", "--prompts", "P"]),
    "rm-eval": (RMEvalConfig, ["--reward-model", "R", "--data", "D"]),
}


class Reached(Exception):
    """The config passed every check: the command would now load its models."""


def leaves(cls: type, prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted key, type) of every field of `cls` that is not a group, at every depth."""
    found = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if is_group(tp):
            found.extend(leaves(tp, f"{prefix}{f.name}."))
        else:
            found.append((f"{prefix}{f.name}", tp))
    return found


def base_type(tp):
    """int / float / bool / str / list / dict / "choice" of a field type (None dropped)."""
    if choices(tp) is not None:
        return "choice"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return base_type(args[0])
    if origin in (typing.Union, __import__("types").UnionType):
        inner = [a for a in args if a is not type(None)]
        return base_type(inner[0]) if len(inner) == 1 else "union"
    return origin or tp


def bad_values(key: str, tp) -> list[tuple[str, str]]:
    """(value as typed on the command line, what is wrong with it) for the field."""
    kind = base_type(tp)
    if kind in (int, float):
        cases = [("[1, 2]", "wrong type"), ("abc", "wrong type")]
        if key not in SIGNED_OK:
            cases.append(("-1000000000", "out of range"))
        return cases
    if kind is bool:
        return [("maybe", "wrong type"), ("3", "wrong type")]
    if kind == "choice":
        return [("no_such_choice_xyz", "not a choice")]
    if kind is str:
        return [("[1, 2]", "wrong type")]
    if kind in (list, tuple):
        return [("{a: 1}", "wrong type")]
    if kind is dict:
        return [("[1, 2]", "wrong type")]
    return []


def run(argv: list[str], capsys) -> tuple[int | str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own usage errors
        code = stop.code
    return code, capsys.readouterr().err


@pytest.fixture
def stop_before_models(monkeypatch):
    def reached(config):
        raise Reached

    monkeypatch.setattr("rlhf.rundir.preflight.preflight", reached)


@pytest.mark.parametrize(
    "command",  # train: ~350 cases, about 8 s on one core
    [pytest.param(c, marks=pytest.mark.slow) if c == "train" else c for c in sorted(STAGES)],
)
def test_every_config_field_refuses_wrong_values(command, tmp_path, capsys, stop_before_models):
    cls, required = STAGES[command]
    failed, tried = [], 0
    out = ["--out", str(tmp_path / ("o.json" if command in ("eval", "rm-eval") else "o"))]
    keys = {key for key, _ in leaves(cls)}
    string_flags = {a.dest for a in subparser(command)._actions if a.option_strings and a.type is None}
    for key, tp in leaves(cls):
        if key in ("out",):
            continue
        group = key.rpartition(".")[0]
        switch = [f"--{group}.enabled", "true"] if f"{group}.enabled" in keys else []  # lora.r with lora on
        for value, what in bad_values(key, tp):
            if what == "wrong type" and key in string_flags:
                continue  # a named flag reads any text as a path (`--model '[1, 2]'` names a folder)
            tried += 1
            code, err = run([command, *required, *out, *switch, f"--{key}", value], capsys)
            named = key in err or key.rsplit(".", 1)[-1] in err
            if code != 2 or not named or "Traceback" in err:
                failed.append(f"--{key} {value} ({what}): exit {code}: {err.strip()[:200]}")
    assert tried > 20
    assert failed == [], f"{len(failed)} of {tried} not refused:\n" + "\n".join(failed)


def typed_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of `parser` that take a typed value (int, float or a checked type)."""
    return [
        a
        for a in parser._actions
        if a.option_strings and a.type not in (None, str, scalar) and a.nargs is None
    ]


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["demo", "ablate", "plan"])
def test_every_typed_flag_refuses_wrong_values(command, capsys, tmp_path, monkeypatch):
    import rlhf.demo.ablate.runner as ablate
    import rlhf.demo.run as demo

    def stop(*args, **kwargs):  # a value let through stops here, before any work
        raise Reached

    monkeypatch.setattr(demo, "prepare_stage", stop)
    monkeypatch.setattr(ablate, "_stage", stop)
    flags = typed_flags(subparser(command))
    assert flags, command
    base = ["--model", "7b"] if command == "plan" else ["--out", str(tmp_path / "out")]
    failed = []
    for action in flags:
        flag = action.option_strings[0]
        for value in ("abc", "-5", "0"):
            code, err = run([command, *base, flag, value], capsys)
            if code != 2 or "Traceback" in err or flag not in err:
                failed.append(f"{flag} {value}: exit {code}: {err.strip()[-200:]}")
    assert failed == [], "\n".join(failed)


def test_the_walk_sees_every_stage_field():
    """The walk is the dataclasses' own: a field added to a config is tried without editing this file."""
    keys = {key for key, _ in leaves(RLConfig)}
    assert {"kl.beta", "train.iterations", "ray.address", "log.sinks"} <= keys
    assert len(keys) > 100
