"""rlhf/rundir/outputs.py: an --out that holds only what an earlier run of the same command left (its
lock, config, an ablation's folders and reports) is taken over; anything else of the user's is
refused, naming it. (The commands refusing such an --out, end to end: tests/reliability's
test_ablate_out.py and test_trust_first_use.py.)"""

from __future__ import annotations

import pytest

from rlhf.config import ConfigError
from rlhf.rundir.outputs import ABLATE_OUTPUTS, check_out_holds_nothing_of_yours


def test_an_earlier_runs_leftovers_are_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("123")
    (run / "config.yaml").write_text("seed: 0\n")
    check_out_holds_nothing_of_yours(run, "sft")  # a run stopped before its metrics: no refusal
    check_out_holds_nothing_of_yours(tmp_path / "new", "sft")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="notes.txt"):
        check_out_holds_nothing_of_yours(run, "sft")


def test_an_ablation_folder_resumes(tmp_path):
    run = tmp_path / "ablate"
    for name in ("world", "sft", "rm", "runs"):
        (run / name).mkdir(parents=True)
    for name in (".lock", "stage.json", "ablation.json", "report.html", "ablation.md"):
        (run / name).write_text("{}")
    check_out_holds_nothing_of_yours(run, "ablate", leftovers=ABLATE_OUTPUTS)  # no refusal
    (run / "mine.txt").write_text("mine")
    with pytest.raises(ConfigError, match="mine.txt"):
        check_out_holds_nothing_of_yours(run, "ablate", leftovers=ABLATE_OUTPUTS)
