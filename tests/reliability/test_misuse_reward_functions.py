"""Trust under misuse, reward functions: whatever the user's module does wrong, at import
or at call (a syntax error, ImportError, exit(), KeyboardInterrupt, a value finite in float64 but
not in float32, NaN), `rlhf train` exits with code 2 and one message naming `module:function`, with
no traceback and the user's files as they were; a real Ctrl-C stays exit code 130. Functions in
TRL's form (called by keyword) run, and the older four-argument form still does."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    command,
    env,
    records,
    write_jsonl,
)

TINY = [
    "--preset", "reinforce_pp", "--rollout.batch_size", "4", "--rollout.max_new_tokens", "3",
    "--train.micro_batch_size", "4", "--log.sinks", "jsonl", "--train.iterations", "1",
]  # fmt: skip


@pytest.fixture
def module(tmp_path, monkeypatch):
    """write(name, source) -> the module file `name`.py, importable (its directory on sys.path)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        monkeypatch.delitem(sys.modules, name, raising=False)
        return path

    return write


def digest(*paths: Path) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def train(capsys, files, out: Path, fn: str, prompts=None, *extra) -> InProcess:
    return InProcess(capsys, "train", "--policy", files["policy"], "--prompts", prompts or files["prompts"],
                     "--out", out, "--reward-fn", fn, *TINY, *extra)  # fmt: skip


# --- at import: before any model loads ------------------------------------------------------------


@pytest.mark.parametrize(
    "source,named",
    [
        ("def f(prompts, completions)\n    return 1\n", ["has a syntax error at", ".py:1", "Fix:"]),
        (
            "import no_such_dependency_xyz\n",
            ["importing module", "no_such_dependency_xyz", ".py:1", "Fix: install"],
        ),
        ("raise SystemExit(3)\n", ["called exit(3)", ".py:1", "__name__ == '__main__'"]),
        ("import sys\nsys.exit('done')\n", ["called exit('done')", ".py:2", "Fix:"]),
        ("raise KeyboardInterrupt\n", ["raised KeyboardInterrupt", "no Ctrl-C was pressed", "Fix:"]),
        ("x = 1 / 0\n", ["raised ZeroDivisionError", ".py:1", "Fix:"]),
    ],
    ids=["syntax-error", "import-error", "exit-code", "exit-message", "keyboard-interrupt", "exception"],
)
def test_a_module_that_fails_to_import_is_named(source, named, module, files, tmp_path, capsys):
    path = module("broken_rewards", source)
    before = digest(path, files["prompts"])
    result = train(capsys, files, tmp_path / "run", "broken_rewards:f")
    assert_user_error(result, "reward function broken_rewards:f", *named)
    assert result.stderr.count("\n") == 1  # one message
    assert digest(path, files["prompts"]) == before and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_missing_module_says_to_check_the_name(files, tmp_path, capsys):
    result = train(capsys, files, tmp_path / "run", "no_such_rewards_xyz:f")
    assert_user_error(result, "reward function no_such_rewards_xyz:f", "cannot import module", "PYTHONPATH")


def test_a_field_the_function_requires_and_the_prompts_lack_is_named(module, files, tmp_path, capsys):
    module("needs_field", "def f(completions, solution):\n    return [0.0] * len(completions)\n")
    result = train(capsys, files, tmp_path / "run", "needs_field:f")
    assert_user_error(result, "needs_field:f takes 'solution'", str(files["prompts"]), 'add "solution"')
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --- at call: before the iteration trains ---------------------------------------------------------


@pytest.mark.parametrize(
    "body,named",
    [
        ("import no_such_dependency_xyz", ["raised ModuleNotFoundError", "calls_fail.py:4"]),
        ("raise SystemExit(0)", ["called exit(0)", "instead of exiting"]),
        ("raise KeyboardInterrupt", ["raised KeyboardInterrupt", "no Ctrl-C was pressed"]),
        ("return [1e300] * len(completions)", ["returned 1e+300 for row 0", "beyond float32", "sane scale"]),
        ("return [0.0] + [-1e39] * (len(completions) - 1)", ["returned -1e+39 for row 1", "beyond float32"]),
        ("return [float('nan')] * len(completions)", ["returned nan for row 0"]),
        ("return [float('inf')] * len(completions)", ["returned inf for row 0"]),
        ("return [[1.0]] * len(completions)", ["returned shape (4, 1) for 4 responses (iteration 0)"]),
    ],
    ids=["import-error", "exit-0", "keyboard-interrupt", "1e300", "-1e39", "nan", "inf", "nested"],
)
def test_a_function_that_fails_when_called_is_named(body, named, module, files, tmp_path, capsys):
    path = module("calls_fail", f"\n\ndef f(prompts, completions, **kwargs):\n    {body}\n")
    before = digest(path, files["prompts"])
    result = train(capsys, files, tmp_path / "run", "calls_fail:f")
    assert_user_error(result, "reward function calls_fail:f", *named, "Fix:")
    assert digest(path, files["prompts"]) == before
    assert not [r for r in records(tmp_path / "run") if "iteration" in r and "event" not in r]


def test_a_weight_that_pushes_a_value_past_float32_is_named(module, files, tmp_path, capsys):
    module("scaled", "def f(completions, **kwargs):\n    return [1e30] * len(completions)\n")
    config = tmp_path / "c.yaml"
    config.write_text("reward:\n  functions:\n    - {name: 'scaled:f', weight: 1.0e+10}\n")
    result = InProcess(capsys, "train", "--policy", files["policy"], "--prompts", files["prompts"],
                       "--out", tmp_path / "run", "--config", config, *TINY)  # fmt: skip
    assert_user_error(result, "scaled:f returned 1e+30", "times its weight 1e+10", "lower its weight")


@pytest.mark.slow
def test_ctrl_c_inside_a_reward_function_is_still_an_interrupt(module, files, tmp_path):
    marker = tmp_path / "called"
    module("slow_rewards", f"""
        import pathlib, time

        def f(completions, **kwargs):
            pathlib.Path({str(marker)!r}).write_text("in")
            time.sleep(60)
            return [0.0] * len(completions)
        """)  # fmt: skip
    args = ["train", "--policy", files["policy"], "--prompts", files["prompts"], "--out", tmp_path / "run",
            "--reward-fn", "slow_rewards:f", *TINY]  # fmt: skip
    run_env = {**env(), "PYTHONPATH": f"{env()['PYTHONPATH']}:{tmp_path}"}
    process = subprocess.Popen(command(*args), env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted at iteration 0" in stderr and "Traceback" not in stderr


# --- TRL's form, and the older one ----------------------------------------------------------------


def test_a_trl_style_function_gets_completions_and_the_prompt_files_fields(module, files, tmp_path, capsys):
    seen = tmp_path / "seen.txt"
    module("trl_rewards", f"""
        import json

        def f(completions, completion_ids, answer, **kwargs):
            with open({str(seen)!r}, "a") as out:
                out.write(json.dumps({{"answer": answer, "kwargs": sorted(kwargs), "n": len(completion_ids)}}) + "\\n")
            return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]
        """)  # fmt: skip
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"a {w}", "answer": w, "level": i}
                                                 for i, w in enumerate("bcdefghi")])  # fmt: skip
    assert_ok(train(capsys, files, tmp_path / "run", "trl_rewards:f", prompts))
    call = [__import__("json").loads(line) for line in seen.read_text().splitlines()][0]
    assert call["n"] == 4 and set(call["answer"]) <= set("bcdefghi")
    assert call["kwargs"] == ["level", "prompts"]  # every field but `prompt`, and the prompt texts


def test_the_older_four_argument_form_still_runs(files, tmp_path, capsys):
    assert_ok(train(capsys, files, tmp_path / "run", "tests.support.reward_fns_testing:length"))
