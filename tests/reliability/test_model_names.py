"""`--model NAME` that names no directory: a hub id is tried only when it can be one and the hub
can say so; a typo stops at once (exit 2) naming the path and the fix, instead of a minute of
retries against an unreachable hub. Nothing here reaches the network: offline mode, or the one
request to the hub replaced."""

from __future__ import annotations

import time

import huggingface_hub
import pytest

from tests.support.reliability_testing import InProcess, assert_user_error


def sft(capsys, files, tmp_path, model):
    started = time.monotonic()
    result = InProcess(capsys, "sft", "--model", model, "--data", files["sft"], "--out", tmp_path / "out")
    return result, time.monotonic() - started


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Offline mode; a test that turns it off replaces the hub request."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("the test reached for the hub")

    monkeypatch.setattr(huggingface_hub, "model_info", refuse)


def online(monkeypatch):
    """Offline mode off, whatever the suite's environment (the hub client reads it at import)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.mark.parametrize("name", ["typo_dir", "runs/typo"])
def test_a_name_that_is_no_directory_stops_at_once_in_offline_mode(
    capsys, files, tmp_path, monkeypatch, name
):
    monkeypatch.chdir(tmp_path)
    result, seconds = sft(capsys, files, tmp_path, name)
    stderr = assert_user_error(result, f"no directory {name!r}", str(tmp_path), "offline mode", "Fix:")
    assert "Traceback" not in stderr and seconds < 20  # before: ~50 s of retries, then exit 2
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_name_that_cannot_be_a_hub_id_stops_at_once(capsys, files, tmp_path, monkeypatch):
    online(monkeypatch)
    result, _ = sft(capsys, files, tmp_path, "my model--v2")
    assert_user_error(result, "no directory 'my model--v2'", "is not a hub id", "Fix:")


class ConnectError(Exception):
    """What the hub client raises when DNS or the connection fails."""


def test_an_unreachable_hub_is_asked_once(capsys, files, tmp_path, monkeypatch):
    online(monkeypatch)
    calls = []

    def unreachable(name, timeout=None, **kwargs):
        calls.append((name, timeout))
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    result, _ = sft(capsys, files, tmp_path, "typo_dir")
    assert_user_error(result, "no directory 'typo_dir'", "cannot be reached", "HF_HUB_OFFLINE=1")
    assert len(calls) == 1 and calls[0][1] is not None  # one request, with a timeout


def test_a_model_the_hub_does_not_have_stops_at_once(capsys, files, tmp_path, monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    online(monkeypatch)

    class NotFound(RepositoryNotFoundError):
        def __init__(self, message: str) -> None:
            Exception.__init__(self, message)  # without the HTTP response the real one carries

    def missing(name, **kwargs):
        raise NotFound("404 Repository Not Found")

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    result, _ = sft(capsys, files, tmp_path, "typo_dir")
    assert_user_error(result, "no directory 'typo_dir'", "the hub has no model 'typo_dir'")


def test_a_model_in_the_hub_cache_is_left_to_transformers(monkeypatch, tmp_path):
    from rlhf.models import loading

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    (tmp_path / "models--gpt2").mkdir()
    loading.check_hub_id("gpt2")  # offline, but cached: no error (transformers loads from the cache)
