"""A model directory is data: its Python code never runs and its pickle weights are never read
unless the user's flag says so; refusals name the file and the flag, and the flag works."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.support.reliability_testing import InProcess, assert_ok, assert_user_error

SFT_ONE_STEP = ["--train.max_steps", "1", "--train.batch_size", "2", "--sinks", "jsonl"]


def sft(capsys, model, files, out, *flags) -> InProcess:
    return InProcess(
        capsys, "sft", "--model", model, "--data", files["sft"], "--out", out, *SFT_ONE_STEP, *flags
    )


@pytest.fixture()
def custom_code_model(files, tmp_path):
    """The policy directory with an auto_map pointing at a module that leaves a file when imported."""
    model = tmp_path / "custom"
    shutil.copytree(files["policy"], model)
    sentinel = tmp_path / "code-ran"
    (model / "modeling_custom.py").write_text(
        f"from pathlib import Path\nPath({str(sentinel)!r}).write_text('ran')\n"
        "from transformers import LlamaForCausalLM\n\n\nclass CustomForCausalLM(LlamaForCausalLM):\n    pass\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    return model, sentinel


@pytest.mark.slow
def test_custom_code_is_refused_until_the_flag_is_given(custom_code_model, files, tmp_path, capsys):
    model, sentinel = custom_code_model
    refused = sft(capsys, model, files, tmp_path / "refused")
    assert_user_error(refused, str(model / "config.json"), "auto_map", "--trust-remote-code")
    assert not sentinel.exists()
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()
    assert_ok(sft(capsys, model, files, tmp_path / "trusted", "--trust-remote-code"))
    assert sentinel.exists()  # the flag is what lets the code run


@pytest.mark.slow
def test_pickle_weights_need_the_flag(files, tmp_path, capsys):
    model = tmp_path / "pickled"
    shutil.copytree(files["policy"], model)
    from safetensors.torch import load_file

    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    refused = InProcess(
        capsys, "sft", "--model", model, "--data", files["sft"], "--out", tmp_path / "refused"
    )
    assert_user_error(refused, str(model), "pytorch_model.bin", "--allow-pickle")
    allowed = InProcess(capsys, "sft", "--model", model, "--data", files["sft"], "--out", tmp_path / "allowed",
                        *SFT_ONE_STEP, "--allow-pickle")  # fmt: skip
    assert_ok(allowed)
    assert (tmp_path / "allowed" / "model.safetensors").is_file()  # the export is safetensors


class _Payload:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling this creates a file


@pytest.mark.slow
def test_a_malicious_pickle_is_refused_without_advising_weights_only_false(files, tmp_path, capsys):
    model = tmp_path / "malicious"
    shutil.copytree(files["policy"], model)
    from safetensors.torch import load_file

    state = load_file(model / "model.safetensors")
    sentinel = tmp_path / "unpickled"
    torch.save({**state, "payload": _Payload(sentinel)}, model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    stderr = assert_user_error(
        sft(capsys, model, files, tmp_path / "out", "--allow-pickle"), str(model), "safetensors"
    )
    assert "weights_only" not in stderr
    assert not sentinel.exists()


def test_the_flags_hold_for_one_command_only(files, tmp_path, capsys):
    from rlhf.models.trust import load_policy

    InProcess(capsys, "eval", "--policy", tmp_path / "missing", "--baseline", "b", "--judge", "j",
              "--prompts", "p", "--allow-pickle", "--trust-remote-code")  # fmt: skip
    assert not load_policy().allow_pickle and not load_policy().trust_remote_code
