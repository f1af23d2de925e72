"""`rlhf train --resume` never continues on something else than the run started from: a changed model
file (here the reference, i.e. the --policy directory, re-saved with other weights) is refused naming
the file and the override, which then continues and records the change; a hand-edited config.yaml
is refused naming the changed key; a resume that changes nothing leaves config.yaml as it was."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    file_bytes,
    iterations,
    logged_warnings,
    train_args,
)

pytestmark = pytest.mark.slow  # each test trains a tiny run and resumes it (over 2 s)


@pytest.fixture
def run(files, tmp_path, capsys):
    policy = tmp_path / "policy"  # a copy of its own: the test changes it
    shutil.copytree(files["policy"], policy)
    out = tmp_path / "run"
    args = train_args({**files, "policy": policy}, out, "--train.iterations", "1", "--checkpoint.every", "1")
    assert_ok(InProcess(capsys, *args))  # the run to resume (set-up: no process of its own needed)
    return out, policy


def records_of(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("config.yaml", "metrics.jsonl", "run_inputs.json")}


def test_a_changed_reference_model_is_refused_then_allowed_with_the_override(run, capsys, caplog):
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.tiny import tiny_causal_lm

    out, policy = run
    recorded = json.loads((out / "run_inputs.json").read_text())["models"]
    assert set(recorded) == {"model.policy", "model.reward_model"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(recorded["model.policy"]["files"])
    # the reference directory re-saved in place with other weights (same names, same shapes)
    tiny_causal_lm(load_tokenizer(policy), seed=5, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(
        policy
    )
    before, models_before = records_of(out), file_bytes(policy)

    caplog.clear()
    refused = InProcess(capsys, "train", "--resume", out, "--train.iterations", "2")
    message = assert_user_error(
        refused,
        "model.policy",
        str(policy),
        "model.safetensors changed",
        "--resume-allow-changed-models",
        "Fix:",
    )
    assert message.count("\n") == 1 and logged_warnings(caplog) == []  # one message
    assert records_of(out) == before and file_bytes(policy) == models_before and iterations(out) == [0]

    allowed = InProcess(
        capsys, "train", "--resume", out, "--train.iterations", "2", "--resume-allow-changed-models"
    )
    assert_ok(allowed)
    assert "resuming on changed models" in allowed.stderr and "model.safetensors changed" in allowed.stderr
    assert iterations(out) == [0, 1]
    record = json.loads((out / "run_inputs.json").read_text())
    assert record["accepted_changes"][0]["iteration"] == 1
    assert (
        record["models"]["model.policy"]["files"]["model.safetensors"]["sha256"]
        != (recorded["model.policy"]["files"]["model.safetensors"]["sha256"])
    )
    # the override applies to a resume only
    fresh = InProcess(capsys, *train_args({"policy": policy, "rm": out, "prompts": out}, out.parent / "new"),
                      "--resume-allow-changed-models")  # fmt: skip
    assert_user_error(fresh, "--resume-allow-changed-models", "Fix:")


def test_a_hand_edited_config_is_refused_and_a_resume_without_change_keeps_it(run, capsys):
    out, _ = run
    config = out / "config.yaml"
    original = config.read_bytes()
    edited = original.replace(b"\nseed: 0\n", b"\nseed: 7\n")
    assert edited != original
    config.write_bytes(edited)
    result = InProcess(capsys, "train", "--resume", out, "--train.iterations", "2")
    assert_user_error(result, str(config), "seed (the run wrote 0, the file now says 7)", "Fix:")
    assert config.read_bytes() == edited and iterations(out) == [0]  # the user's file as they left it

    config.write_bytes(original)  # the fix: the recorded values back
    stamp = config.stat().st_mtime_ns
    assert_ok(InProcess(capsys, "train", "--resume", out))  # nothing changed: nothing to rewrite
    assert config.read_bytes() == original and config.stat().st_mtime_ns == stamp
    assert_ok(
        InProcess(capsys, "train", "--resume", out, "--train.iterations", "2")
    )  # a change a resume may make
    assert b"iterations: 2" in config.read_bytes() and iterations(out) == [0, 1]
    assert_ok(InProcess(capsys, "train", "--resume", out))  # the rewritten file is the new record
