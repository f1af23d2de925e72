"""`rlhf sft`, `rm` and `dpo` show their progress as `rlhf train` does: the model's loading, each
part of a first step named, steps counted as updates done (`step 3/3` at the end, `step 0/3` for the
held-out figures before the first update), the export, and what the run directory keeps."""

from __future__ import annotations

import pytest
import torch

from rlhf.cli import main
from tests.support.cli_data import pair_rows, save_tiny_base, sft_rows, write_jsonl

torch.set_num_threads(1)
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
SHORT = ["--train.max_steps", "3", "--train.batch_size", "4", "--sinks", "[console, jsonl]"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("supervised_progress")
    save_tiny_base(root / "base", WORDS)
    return {
        "base": str(root / "base"),
        "sft": write_jsonl(root / "sft.jsonl", sft_rows(WORDS)),
        "pairs": write_jsonl(root / "pairs.jsonl", pair_rows(WORDS)),
    }


def progress(stdout: str, name: str) -> list[str]:
    return [line.split(" |")[0] for line in stdout.splitlines() if line.startswith(f"[{name}]")]


@pytest.mark.slow
def test_sft_counts_updates_done_and_says_what_it_does(base, tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", "--model", base["base"], "--data", base["sft"], "--out", str(out), *SHORT]) == 0
    stdout = capsys.readouterr().out
    assert progress(stdout, "sft") == [
        "[sft] step 1/3: evaluating before training ...",
        "[sft] step 0/3 (0%)",  # the held-out figures before any update
        "[sft] step 1/3 (33%)",
        "[sft] step 3/3 (100%)",  # every update done, the last one counted
    ]
    lines = stdout.splitlines()
    assert lines[0] == f"loading the model {base['base']} ..."
    assert f"writing the trained model to {out}: done (" in stdout
    assert lines[-2].startswith(f"{out} keeps ") and "checkpoints/" not in lines[-2]
    assert lines[-1] == f"report: {out / 'report.html'}"


@pytest.mark.slow
def test_dpo_names_its_reference_pass_and_a_resumed_run_counts_on(base, tmp_path, capsys):
    out = tmp_path / "dpo"
    args = ["dpo", "--model", base["base"], "--data", base["pairs"], "--out", str(out), *SHORT]
    assert main([*args, "--checkpoint.every", "2"]) == 0
    stdout = capsys.readouterr().out
    assert progress(stdout, "dpo")[:2] == [
        "[dpo] step 1/3: scoring every pair with the reference ...",
        "[dpo] step 1/3: training ...",
    ]
    assert progress(stdout, "dpo")[-1] == "[dpo] step 3/3 (100%)"
    assert f"{out} keeps " in stdout and "checkpoints/" in stdout and "(1 kept, checkpoint.keep 2" in stdout
    assert main(["dpo", "--resume", str(out)]) == 0  # from the checkpoint of the first 2 updates
    resumed = progress(capsys.readouterr().out, "dpo")
    assert resumed[0].startswith("[dpo] step 3/3") and resumed[-1] == "[dpo] step 3/3 (100%)", resumed
