"""The dependencies will not break under a user: pyproject bounds every dependency to the
versions tested, the installed ones are inside those bounds, rlhf's own calls raise no deprecation
warning (an error here, while the old name still works), and the console of a run shows no library
warning the user cannot act on."""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from rlhf.cli import main
from rlhf.models.sampling import cache_keyword
from tests.support.cli_data import pair_rows, save_tiny_base, sft_rows, write_jsonl
from tests.support.reliability_testing import rlhf
from tests.support.train_testing import rl_config

ROOT = Path(__file__).resolve().parents[2]
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()

# transformers and PEFT APIs rlhf calls (or that are called on its behalf) whose names have changed:
# a deprecation naming one is an error, whichever module transformers attributes it to (a renamed
# keyword is attributed to torch's Module.__call__, the caller of the decorated forward)
RENAMED_APIS = [
    "past_key_values",  # the decoder's KV cache: `cache` (removed in transformers 5.40)
    "is_gradient_checkpointing",  # read by PEFT while wrapping: `is_activation_checkpointing`
    "gradient_checkpointing_enable",  # `activation_checkpointing_enable`
    "gradient_checkpointing_disable",  # `activation_checkpointing_disable`
    "torch_dtype",  # from_pretrained's `dtype`
]


@contextlib.contextmanager
def our_deprecations_are_errors():
    """DeprecationWarning and FutureWarning raised from rlhf's code, or naming an API of
    RENAMED_APIS, raise; a dependency's deprecations inside its own code keep pytest's filter."""
    with warnings.catch_warnings():
        names = "|".join(map(re.escape, RENAMED_APIS))
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("error", category=category, module=r"rlhf(\.|$)")
            warnings.filterwarnings("error", category=category, message=rf".*\b({names})\b")
        yield


def _requirements() -> list[Requirement]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [
        Requirement(line) for line in [*project["dependencies"], *(r for e in extras.values() for r in e)]
    ]


def test_every_dependency_has_a_lower_and_an_upper_bound():
    for requirement in _requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {"=="} or operators == {">=", "<"}, f"{requirement}: give >=tested,<next"
    assert Requirement("torch==2.13.0") in _requirements()  # the local CPU wheel, exactly


def test_the_installed_versions_are_inside_the_ranges():
    try:
        version("rlhf")
    except PackageNotFoundError:  # run from a checkout (the GPU machine's own torch and transformers)
        pytest.skip("rlhf is not installed here: pip resolved nothing from pyproject.toml")
    for requirement in _requirements():
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:  # an extra not installed (ray, tensorboard)
            continue
        installed = installed.split("+")[0]  # torch's local tag: 2.13.0+cpu is 2.13.0
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement.name} {installed} is installed, outside pyproject's {requirement}"
        )


def test_the_kv_cache_keyword_follows_the_decoders_signature():
    from transformers import LlamaModel

    class Older(torch.nn.Module):  # a decoder before the rename: `cache` would go to **kwargs
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            return input_ids

    # renamed in 5.24 (here); 5.17 (the GPU machine) takes `past_key_values`, and **kwargs
    renamed = "cache" in inspect.signature(LlamaModel.forward).parameters
    assert cache_keyword(LlamaModel) == ("cache" if renamed else "past_key_values")
    assert cache_keyword(Older) == "past_key_values"


def test_an_rl_iteration_with_lora_and_checkpointing_raises_no_deprecation(make_trainer):
    """Sampling (the decoder with a KV cache), the reference and reward forwards, PPO steps of a LoRA
    policy and a critic, both checkpointed."""
    config = rl_config("ppo_max", model={"gradient_checkpointing": True, "lora": {"enabled": True}})
    with our_deprecations_are_errors():
        make_trainer(config).step()


def test_sft_and_rm_with_lora_and_checkpointing_raise_no_deprecation(tmp_path):
    save_tiny_base(tmp_path / "base", WORDS)
    sft, pairs = (
        write_jsonl(tmp_path / "sft.jsonl", sft_rows(WORDS)),
        write_jsonl(tmp_path / "pairs.jsonl", pair_rows(WORDS)),
    )
    short = ["--train.max_steps", "1", "--train.batch_size", "4", "--sinks", "jsonl",
             "--lora.enabled", "true", "--gradient_checkpointing", "true"]  # fmt: skip
    with our_deprecations_are_errors():
        assert main(["sft", "--model", str(tmp_path / "base"), "--data", sft, "--out", str(tmp_path / "sft"),
                     *short]) == 0  # fmt: skip
        assert main(["rm", "--model", str(tmp_path / "sft"), "--data", pairs, "--out", str(tmp_path / "rm"),
                     *short]) == 0  # fmt: skip


@pytest.mark.slow
def test_the_console_of_a_run_shows_no_library_warning(tmp_path):
    """`rlhf sft` and `rlhf train` (LoRA, gradient checkpointing) as a user runs them, with Python's
    default warning filters: stderr holds no warning."""
    save_tiny_base(tmp_path / "base", WORDS)
    pairs = pair_rows(WORDS)
    sft, prompts = (
        write_jsonl(tmp_path / "sft.jsonl", sft_rows(WORDS)),
        write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pairs[:8]]),
    )
    runs = [
        ["sft", "--model", tmp_path / "base", "--data", sft, "--out", tmp_path / "sft", "--train.max_steps", "2",
         "--train.batch_size", "4", "--lora.enabled", "true", "--gradient_checkpointing", "true"],
        ["train", "--preset", "grpo", "--policy", tmp_path / "sft", "--reward-fn",
         "tests.support.reward_fns_testing:length", "--prompts", prompts, "--out", tmp_path / "run",
         "--train.iterations", "1", "--rollout.batch_size", "4", "--rollout.max_new_tokens", "4",
         "--train.micro_batch_size", "4", "--model.lora.enabled", "true",
         "--model.gradient_checkpointing", "true"],
    ]  # fmt: skip
    for args in runs:
        result = rlhf(*args)  # a child process: Python's default filters, not pytest's
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", f"rlhf {args[0]} wrote to stderr:\n{result.stderr}"
