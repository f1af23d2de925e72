"""A misuse corpus that can be rerun: user mistakes, each with the exit code and message it must get.

    python tools/misuse_corpus.py                  # every case, a table of outcomes
    python tools/misuse_corpus.py --only yaml_bom,out_is_file --json out.json
    python tools/misuse_corpus.py --list

Each case is a command line of `rlhf`, the files to set up beside the shared inputs (a tiny policy
`policy/`, a reward model `rm/`, `sft.jsonl`, `pairs.jsonl`, `prompts.jsonl`), the exit code it must
end with, words its message must contain (the key or file, the value given, the fix), and the files
that must be byte-identical afterwards (by default every file that existed before the run: a refused
command touches nothing, a finished one leaves its inputs alone). Each case runs in a fresh temporary
directory (the working directory of the command) in its own process, as a user would run it.

A case passes when the exit code is the expected one, every word is in the output, no traceback is
printed, and no file that had to stay is changed or gone. Exit 1 (a bug: "This is a bug in rlhf")
is never an expected code: every user mistake is exit 2 (rlhf/cli_errors.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
TINY_SUPERVISED = ["--train.max_steps", "1", "--train.batch_size", "4", "--sinks", "jsonl"]
TINY_TRAIN = ["--train.iterations", "1", "--rollout.batch_size", "4", "--rollout.max_new_tokens", "3",
              "--train.micro_batch_size", "4", "--log.sinks", "jsonl"]  # fmt: skip
ALL = "all"  # `unchanged`: every file that existed before the run


@dataclass
class Case:
    name: str
    args: list[str]  # after `rlhf`, paths relative to the case's directory
    code: int = 2
    words: tuple[str, ...] = ()  # each must appear in stdout + stderr
    setup: Callable[[Path], None] | None = None  # creates the case's own files in its directory
    unchanged: str | tuple[str, ...] = ALL  # relative paths (files or folders) that must stay as they were
    env: dict[str, str] = field(default_factory=dict)
    skip: Callable[[], str | None] | None = None  # the reason it cannot run here, or None


# -- setting up files -------------------------------------------------------------------------------


def write(name: str, text: str | bytes) -> Callable[[Path], None]:
    """A setup that writes `text` (str: UTF-8) to `name` in the case's directory."""

    def setup(work: Path) -> None:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode() if isinstance(text, str) else text)

    return setup


def steps(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        for one in setups:
            one(work)

    return setup


def copy_model(source: str, target: str, drop: tuple[str, ...] = ()) -> Callable[[Path], None]:
    """A copy of the model directory `source` as `target`, without the files whose names start with
    one of `drop`."""

    def setup(work: Path) -> None:
        shutil.copytree(work / source, work / target)
        for path in list((work / target).iterdir()):
            if path.name.startswith(drop):
                path.unlink()

    return setup


def jsonl(rows: list) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


SFT_ROWS = [{"prompt": f"{a} {b}", "response": f"{c} t"} for a, b, c in zip(WORDS, WORDS[1:], WORDS[2:])]
SFT_TEXT = jsonl(SFT_ROWS)


def sft(*extra: str, data: str = "sft.jsonl", out: str = "out") -> list[str]:
    return ["sft", "--model", "policy", "--data", data, "--out", out, *TINY_SUPERVISED, *extra]


def train(*extra: str, out: str = "out") -> list[str]:
    return ["train", "--preset", "vanilla_ppo", "--policy", "policy", "--reward-model", "rm",
            "--prompts", "prompts.jsonl", "--out", out, *TINY_TRAIN, *extra]  # fmt: skip


def as_root() -> str | None:
    return "running as root: file permissions do not stop root" if os.geteuid() == 0 else None


def read_only(work: Path) -> None:
    (work / "locked").mkdir()
    os.chmod(work / "locked", 0o555)


# -- the cases --------------------------------------------------------------------------------------

# named by the issue (#28) or the previous corpus, rerun so that they stay fixed
NAMED = [
    Case(
        "config_is_directory",
        sft("--config", "conf"),
        words=("--config", "conf", "Fix"),
        setup=lambda w: (w / "conf").mkdir(),
    ),
    Case(
        "out_is_existing_file",
        sft(out="notes.txt"),
        words=("--out notes.txt", "existing file", "Fix"),
        setup=write("notes.txt", "mine\n"),
    ),
    Case("sft_out_is_model", sft(out="policy"), words=("--out policy", "--model", "Fix")),
    Case("train_out_is_policy", train(out="policy"), words=("--out policy", "--policy", "Fix")),
    Case(
        "train_out_inside_reward_model",
        train(out="rm/run"),
        words=("--out rm/run", "is inside", "--reward-model"),
    ),
    Case(
        "policy_is_reward_model",
        [
            "train",
            "--preset",
            "vanilla_ppo",
            "--policy",
            "rm",
            "--reward-model",
            "rm",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
            *TINY_TRAIN,
        ],
        words=("--policy rm", "reward-model directory", "Fix"),
    ),  # fmt: skip
    Case(
        "reward_fn_syntax_error",
        train("--reward-fn", "rf_syntax:score"),
        words=("rf_syntax", "syntax error", "Fix"),
        setup=write("rf_syntax.py", "def score(prompts, completions:\n    return [0.0]\n"),
    ),  # fmt: skip
    Case(
        "rm_data_gzip_garbage",
        ["rm", "--model", "policy", "--data", "pairs.jsonl.gz", "--out", "out", *TINY_SUPERVISED],
        words=("pairs.jsonl.gz", "Fix"),
        setup=write("pairs.jsonl.gz", b"\x1f\x8b\x08\x00garbage-not-gzip"),
    ),  # fmt: skip
    Case(
        "data_check_invalid_exit_2",
        ["data", "check", "bad.jsonl"],
        words=("bad.jsonl:1",),
        setup=write("bad.jsonl", "{not json\n"),
    ),  # fmt: skip
    Case(
        "sft_rows_longer_than_positions",
        sft("--data.max_prompt_tokens", "4000", "--data.max_response_tokens", "4000", data="long.jsonl"),
        words=("long.jsonl", "positions", "Fix"),
        setup=write("long.jsonl", jsonl([{"prompt": " ".join(WORDS * 40), "response": "a t"}] * 4)),
    ),  # fmt: skip
    Case("unicode_out_under_c_locale", sft(out="rün-ü"), code=0, env={"LC_ALL": "C", "LANG": "C"}),
]

# new cases of this pass
NEW = [
    # --- YAML config files
    Case(
        "yaml_wrong_type",
        sft("--config", "c.yaml"),
        words=("c.yaml", "train.max_steps", "ten"),
        setup=write("c.yaml", "train:\n  max_steps: ten\n"),
    ),  # fmt: skip
    Case(
        "yaml_top_level_list",
        sft("--config", "c.yaml"),
        words=("c.yaml",),
        setup=write("c.yaml", "- train\n- 3\n"),
    ),
    Case(
        "yaml_empty_file_then_missing_data",
        ["sft", "--model", "policy", "--out", "out", "--config", "c.yaml"],
        words=("--data",),
        setup=write("c.yaml", ""),
    ),  # fmt: skip
    Case(
        "yaml_bom",
        sft("--config", "c.yaml"),
        words=("c.yaml", "data.test_fraction", "1.5"),
        setup=write("c.yaml", "\ufeffdata:\n  test_fraction: 1.5\n"),
    ),  # fmt: skip
    Case(
        "yaml_crlf",
        sft("--config", "c.yaml"),
        words=("c.yaml", "optim.lr", "-1"),
        setup=write("c.yaml", "optim:\r\n  lr: -1\r\n"),
    ),  # fmt: skip
    Case(
        "yaml_syntax_error",
        sft("--config", "c.yaml"),
        words=("c.yaml", "line"),
        setup=write("c.yaml", "train: [1, 2\n"),
    ),
    Case(
        "yaml_unknown_key",
        sft("--config", "c.yaml"),
        words=("c.yaml", "trian"),
        setup=write("c.yaml", "trian:\n  max_steps: 2\n"),
    ),
    Case(
        "yaml_tab_indent",
        sft("--config", "c.yaml"),
        words=("c.yaml",),
        setup=write("c.yaml", "train:\n\tmax_steps: 2\n"),
    ),
    Case(
        "yaml_duplicate_key",
        sft("--config", "c.yaml"),
        words=("c.yaml", "max_steps", "twice"),
        setup=write("c.yaml", "train:\n  max_steps: 1\n  max_steps: 500000\n"),
    ),  # fmt: skip
    Case(
        "yaml_binary_file",
        sft("--config", "c.yaml"),
        words=("c.yaml",),
        setup=write("c.yaml", bytes(range(256))),
    ),
    Case(
        "yaml_utf16",
        sft("--config", "c.yaml"),
        words=("c.yaml",),
        setup=write("c.yaml", "train:\n  max_steps: 1\n".encode("utf-16")),
    ),
    Case("config_missing_file", sft("--config", "nope.yaml"), words=("nope.yaml",)),
    # --- numbers on the command line
    Case("negative_count", sft("--train.max_steps", "-3"), words=("train.max_steps", "-3")),
    Case("zero_batch", train("--rollout.batch_size", "0"), words=("rollout.batch_size", "0")),
    Case(
        "huge_int_budget",
        train("--rollout.max_new_tokens", "99999999999999999999"),
        words=("--rollout.max_new_tokens", "99999999999999999999"),
    ),  # fmt: skip
    Case("huge_float_lr", sft("--optim.lr", "1e400"), words=("optim.lr",)),
    Case("nan_lr", sft("--optim.lr", "nan"), words=("optim.lr", "nan")),
    Case("inf_kl_beta", train("--kl.beta", "inf"), words=("kl.beta", "inf")),
    Case("bool_for_count", sft("--train.max_steps", "true"), words=("train.max_steps", "True")),
    Case("text_for_float", train("--kl.beta", "abc"), words=("kl.beta", "abc")),
    Case("test_fraction_above_1", sft("--data.test_fraction", "1.5"), words=("data.test_fraction", "1.5")),
    Case("checkpoint_keep_negative", train("--checkpoint.keep", "-1"), words=("checkpoint.keep", "-1")),
    # --- flags
    Case("unknown_flag", sft("--train.max_stesp", "3"), words=("max_stesp",)),
    Case("override_without_value", [*sft(), "--optim.lr"], words=("--optim.lr",)),
    Case(
        "unknown_preset",
        [
            "train",
            "--preset",
            "ppo_maxx",
            "--policy",
            "policy",
            "--reward-model",
            "rm",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
        ],
        words=("ppo_maxx", "ppo_max"),
    ),  # fmt: skip
    Case("bad_dtype", sft("--dtype", "float8"), words=("dtype", "float8")),
    Case("cuda_without_gpu", sft("--train.device", "cuda"), words=("train.device", "cuda")),
    # --- data files
    Case("data_empty_file", sft(data="empty.jsonl"), words=("empty.jsonl",), setup=write("empty.jsonl", "")),
    Case(
        "data_only_blank_lines",
        sft(data="blank.jsonl"),
        words=("blank.jsonl",),
        setup=write("blank.jsonl", "\n  \n\n"),
    ),
    Case("data_bom", sft(data="bom.jsonl"), code=0, setup=write("bom.jsonl", "\ufeff" + SFT_TEXT)),
    Case(
        "data_crlf", sft(data="crlf.jsonl"), code=0, setup=write("crlf.jsonl", SFT_TEXT.replace("\n", "\r\n"))
    ),
    Case(
        "data_not_json",
        sft(data="bad.jsonl"),
        words=("bad.jsonl:2", "Fix"),
        setup=write("bad.jsonl", json.dumps(SFT_ROWS[0]) + "\n{'prompt': 'a'}\n"),
    ),  # fmt: skip
    Case(
        "data_missing_field",
        sft(data="nofield.jsonl"),
        words=("nofield.jsonl", "response"),
        setup=write("nofield.jsonl", jsonl([{"prompt": "a b"}] * 4)),
    ),  # fmt: skip
    Case(
        "data_field_wrong_type",
        sft(data="types.jsonl"),
        words=("types.jsonl", "prompt"),
        setup=write("types.jsonl", jsonl([{"prompt": 5, "response": "a t"}] * 4)),
    ),  # fmt: skip
    Case(
        "data_is_directory", sft(data="datadir"), words=("datadir",), setup=lambda w: (w / "datadir").mkdir()
    ),
    Case("data_missing", sft(data="nope.jsonl"), words=("nope.jsonl",)),
    Case(
        "data_binary",
        sft(data="bin.jsonl"),
        words=("bin.jsonl",),
        setup=write("bin.jsonl", bytes(range(256)) * 4),
    ),
    Case(
        "data_utf16",
        sft(data="u16.jsonl"),
        words=("u16.jsonl",),
        setup=write("u16.jsonl", SFT_TEXT.encode("utf-16")),
    ),
    Case(
        "data_parquet_not_parquet",
        sft(data="fake.parquet"),
        words=("fake.parquet",),
        setup=write("fake.parquet", SFT_TEXT),
    ),
    Case(
        "data_symlink_loop",
        sft(data="loop.jsonl"),
        words=("loop.jsonl",),
        setup=lambda w: os.symlink("loop.jsonl", w / "loop.jsonl"),
    ),
    Case(
        "data_json_array_of_numbers",
        sft(data="nums.json"),
        words=("nums.json",),
        setup=write("nums.json", "[1, 2, 3]\n"),
    ),
    Case("prompts_empty_file", train(), words=("prompts.jsonl",), setup=write("prompts.jsonl", "")),
    Case(
        "chat_bad_role",
        sft(data="chat.jsonl"),
        words=("chat.jsonl", "robot"),
        setup=write(
            "chat.jsonl",
            jsonl(
                [{"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "a"}]}]
                * 4
            ),
        ),
    ),  # fmt: skip
    Case(
        "paths_with_spaces",
        sft(data="my data/sft file.jsonl", out="my runs/sft 1"),
        code=0,
        setup=write("my data/sft file.jsonl", SFT_TEXT),
    ),  # fmt: skip
    # --- model directories
    Case(
        "model_without_tokenizer",
        ["sft", "--model", "notok", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
        words=("notok", "tokenizer"),
        setup=copy_model("policy", "notok", drop=("tokenizer", "special_tokens")),
    ),  # fmt: skip
    Case(
        "model_without_weights",
        ["sft", "--model", "noweights", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
        words=("noweights",),
        setup=copy_model("policy", "noweights", drop=("model.safetensors",)),
    ),  # fmt: skip
    Case(
        "model_config_not_json",
        ["sft", "--model", "badconf", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
        words=("badconf", "config.json"),
        setup=steps(copy_model("policy", "badconf"), write("badconf/config.json", "{oops")),
    ),  # fmt: skip
    Case(
        "model_empty_directory",
        ["sft", "--model", "emptydir", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
        words=("emptydir",),
        setup=lambda w: (w / "emptydir").mkdir(),
    ),  # fmt: skip
    Case(
        "model_truncated_weights",
        ["sft", "--model", "cut", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
        words=("cut", "model.safetensors"),
        setup=steps(
            copy_model("policy", "cut"),
            lambda w: (w / "cut/model.safetensors").write_bytes(
                (w / "cut/model.safetensors").read_bytes()[:100]
            ),
        ),
    ),  # fmt: skip
    Case(
        "reward_model_is_policy_dir",
        [
            "train",
            "--preset",
            "vanilla_ppo",
            "--policy",
            "policy",
            "--reward-model",
            "policy",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
            *TINY_TRAIN,
        ],
        words=("policy", "scalar_head", "Fix"),
    ),  # fmt: skip
    # --- resume
    Case(
        "resume_empty_dir",
        ["train", "--resume", "emptyrun"],
        words=("emptyrun",),
        setup=lambda w: (w / "emptyrun").mkdir(),
    ),
    Case("resume_a_model_dir", ["train", "--resume", "policy"], words=("policy",)),
    Case("resume_missing_dir", ["train", "--resume", "nope"], words=("nope",)),
    Case(
        "dpo_resume_empty_dir",
        ["dpo", "--resume", "emptyrun"],
        words=("emptyrun",),
        setup=lambda w: (w / "emptyrun").mkdir(),
    ),
    Case(
        "resume_with_policy_flag_of_a_model",
        ["train", "--resume", "policy", "--policy", "policy"],
        words=("policy",),
    ),
    # --- output paths
    Case("out_read_only_dir", sft(out="locked/run"), words=("locked/run",), setup=read_only, skip=as_root),
    Case("out_on_read_only_fs", sft(out="/proc/rlhf-misuse-out"), words=("/proc/rlhf-misuse-out",)),
    Case(
        "out_under_a_file",
        sft(out="notes.txt/run"),
        words=("notes.txt/run",),
        setup=write("notes.txt", "mine\n"),
    ),
    Case("out_name_too_long", sft(out="r" * 300), words=("r" * 40,)),
    Case(
        "eval_out_foreign_file",
        [
            "eval",
            "--policy",
            "policy",
            "--baseline",
            "policy",
            "--judge",
            "rm",
            "--prompts",
            "prompts.jsonl",
            "--n",
            "2",
            "--max-new-tokens",
            "2",
            "--out",
            "mine.json",
        ],
        words=("mine.json", "Fix"),
        setup=write("mine.json", '{"my": "results"}\n'),
    ),  # fmt: skip
    Case(
        "rm_eval_missing_data",
        ["rm-eval", "--reward-model", "rm", "--data", "nope.jsonl"],
        words=("nope.jsonl",),
    ),
    # --- reward functions
    Case("reward_fn_missing_module", train("--reward-fn", "no_such_module:score"), words=("no_such_module",)),
    Case(
        "reward_fn_not_callable",
        train("--reward-fn", "rf_const:SCORE"),
        words=("rf_const:SCORE",),
        setup=write("rf_const.py", "SCORE = 1.0\n"),
    ),  # fmt: skip
    Case("reward_fn_no_colon", train("--reward-fn", "justaname"), words=("justaname", "module:function")),
    Case(
        "reward_fn_exits",
        train("--reward-fn", "rf_exit:score"),
        words=("rf_exit", "score"),
        setup=write("rf_exit.py", "import sys\n\ndef score(prompts, completions, **kw):\n    sys.exit(3)\n"),
    ),  # fmt: skip
    # --- environments (--env module:Class)
    Case("env_no_colon", train("--env", "justaname"), words=("env.name", "justaname", "module:Class", "Fix")),
    Case(
        "env_class_without_step",
        train("--env", "env_nostep:Tool"),
        words=("env.name", "env_nostep:Tool", "no step method", "Fix"),
        setup=write("env_nostep.py", "class Tool:\n    def __init__(self, row):\n        pass\n"),
    ),  # fmt: skip
    Case(
        "env_step_returns_a_bare_reward",
        train("--env", "env_bare:Tool"),
        words=("env.name env_bare:Tool", "returned 1.0", "(reply: str | None, reward: float, done: bool)"),
        setup=write(
            "env_bare.py",
            "class Tool:\n    def __init__(self, row):\n        pass\n\n"
            "    def step(self, response):\n        return 1.0\n",
        ),
    ),  # fmt: skip
]

CASES = NAMED + NEW


# -- running ----------------------------------------------------------------------------------------


def build_inputs(root: Path) -> None:
    """The shared inputs every case starts from (the reliability suite's tiny models and data)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

    torch.set_num_threads(1)
    tok = word_tokenizer([" ".join(WORDS)])
    tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    reward = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
    ScalarHeadModel.from_causal_lm(reward, head_init_std=0.5).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    pairs = [
        {"prompt": f"{a} {b}", "chosen": f"t {c}", "rejected": f"{c} {a}"}
        for a, b, c in zip(WORDS, WORDS[3:], WORDS[5:])
    ]
    (root / "sft.jsonl").write_text(SFT_TEXT)
    (root / "pairs.jsonl").write_text(jsonl(pairs))
    (root / "prompts.jsonl").write_text(jsonl([{"prompt": p["prompt"]} for p in pairs[:8]]))


def snapshot(work: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `work` (links not followed)."""
    found = {}
    for path in sorted(work.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(work))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@dataclass
class Outcome:
    case: Case
    code: int | None = None
    missing: list[str] = field(default_factory=list)  # words not in the output
    traceback: bool = False
    changed: list[str] = field(default_factory=list)  # files that had to stay and did not
    message: str = ""  # the last line of stderr
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        return self.code == self.case.code and not self.missing and not self.traceback and not self.changed


def _in_process(args: list[str], work: Path) -> tuple[int | None, str, str]:
    """`rlhf.cli.main(args)` in this process, in `work`: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from rlhf.cli import main as rlhf_main

    out, err, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(work)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = rlhf_main(list(args))
            except SystemExit as stop:  # argparse's usage errors
                code = stop.code if isinstance(stop.code, int) else 2
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def run_case(
    case: Case, inputs: Path, scratch: Path, timeout: float = 600, in_process: bool = False
) -> Outcome:
    """Run `case` in a fresh copy of `inputs` under `scratch`: a subprocess as a user runs it, or
    `in_process` (faster, for the test suite: no interpreter start; `env` cases need a process)."""
    reason = case.skip() if case.skip else None
    if in_process and case.env:
        reason = "needs its own process (environment variables)"
    if reason:
        return Outcome(case, skipped=reason)
    work = scratch / case.name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(inputs, work)
    if case.setup:
        case.setup(work)
    before = snapshot(work)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", **case.env}  # fmt: skip
    start = time.monotonic()
    if in_process:
        code, stdout, stderr = _in_process(case.args, work)
    else:
        try:
            run = subprocess.run([sys.executable, "-m", "rlhf", *case.args], cwd=work, env=env, capture_output=True,
                                 text=True, errors="replace", timeout=timeout)  # fmt: skip
            code, stdout, stderr = run.returncode, run.stdout, run.stderr
        except subprocess.TimeoutExpired as err:
            code, stdout, stderr = None, str(err.stdout or ""), f"timed out after {timeout} s"
    outcome = Outcome(case, code=code, seconds=time.monotonic() - start)
    output = stdout + stderr
    outcome.missing = [w for w in case.words if w not in output]
    outcome.traceback = "Traceback (most recent call last)" in output
    after = snapshot(work)
    keep = before if case.unchanged == ALL else {
        k: v for k, v in before.items() if any(k == p or k.startswith(p + "/") for p in case.unchanged)
    }  # fmt: skip
    outcome.changed = [k for k, v in keep.items() if after.get(k) != v]
    lines = [line for line in stderr.splitlines() if line.strip()]
    outcome.message = lines[-1] if lines else ""
    return outcome


def table(outcomes: list[Outcome]) -> str:
    rows = [("case", "expected", "got", "result", "message")]
    for o in outcomes:
        if o.skipped:
            rows.append((o.case.name, str(o.case.code), "-", "skipped", o.skipped))
            continue
        problems = []
        if o.code != o.case.code:
            problems.append(f"exit {o.code}")
        if o.missing:
            problems.append("missing " + ", ".join(repr(w[:40]) for w in o.missing))
        if o.traceback:
            problems.append("traceback")
        if o.changed:
            problems.append("changed " + ", ".join(o.changed[:3]))
        rows.append((o.case.name, str(o.case.code), str(o.code), "ok" if o.ok else "FAIL: " + "; ".join(problems),
                     o.message[:160]))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--json", help="write the outcomes here")
    args = parser.parse_args(argv)
    cases = CASES
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown cases: {sorted(unknown)}")
        cases = [c for c in CASES if c.name in wanted]
    if args.list:
        for case in cases:
            print(f"{case.name}: rlhf {' '.join(case.args)} -> exit {case.code}")
        return 0
    with tempfile.TemporaryDirectory(prefix="rlhf-misuse-") as scratch:
        inputs = Path(scratch) / "inputs"
        build_inputs(inputs)
        outcomes = []
        for case in cases:
            outcomes.append(run_case(case, inputs, Path(scratch)))
            print(
                f"{case.name}: {'ok' if outcomes[-1].ok else 'FAIL'} (exit {outcomes[-1].code})",
                file=sys.stderr,
            )
    print(table(outcomes))
    failed = [o for o in outcomes if not o.ok]
    print(
        f"\n{len(outcomes) - len(failed)} of {len(outcomes)} cases hold ({sum(bool(o.skipped) for o in outcomes)} skipped)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps([
            {"case": o.case.name, "expected": o.case.code, "got": o.code, "ok": o.ok, "skipped": o.skipped,
             "missing": o.missing, "traceback": o.traceback, "changed": o.changed, "message": o.message}
            for o in outcomes], indent=1) + "\n")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
