"""A misuse corpus that can be rerun: user mistakes, each with the exit code and message it must get.

    python tools/misuse_corpus.py                  # every case, a table of outcomes
    python tools/misuse_corpus.py --only yaml_bom,out_is_file --json out.json
    python tools/misuse_corpus.py --list
    python tools/misuse_corpus.py --group surfaces --in-process   # one group, without interpreter starts

Groups (GROUPS): `named` and `new` (the first corpus), then the cases of earlier reviews that the
groups before did not have (`run_dir_and_resume`, `files_and_rows`, `inputs_and_sinks`, `out_paths`)
and `surfaces` (environments, DAPO, the reward server and its client,
verifiers, eval --pairs, token budgets, sampler engines, plan), then classes of input and server
mistakes, each its named cases and new ones (`input_formats`: valid input refused or invalid input
accepted; `outside_numbers`: numbers checked after their cast; `bounded_waits`; `server_input`: a
started `rlhf serve-rm` probed with requests; `wrong_guesses`: a warning that must name the real
cause, and not the wrong one). A case may start from an earlier run (`built`: trained once per
scratch folder, then copied), talk to a local HTTP server (`server`), or probe the server it starts
(`probes`), and has a timeout: a case still running then has hung.

Each case is a command line of `rlhf`, the files to set up beside the shared inputs (a tiny policy
`policy/`, a reward model `rm/`, `sft.jsonl`, `pairs.jsonl`, `prompts.jsonl`), the exit code it must
end with, words its message must contain (the key or file, the value given, the fix), and the files
that must be byte-identical afterwards (by default every file that existed before the run: a refused
command touches nothing, a finished one leaves its inputs alone). Each case runs in a fresh temporary
directory (the working directory of the command) in its own process, as a user would run it.

A case passes when the exit code is the expected one, every word is in the output, no traceback is
printed, and no file that had to stay is changed or gone. Exit 1 (a bug: "This is a bug in rlhf")
is never an expected code: every user mistake is exit 2 (rlhf/cli/errors.py).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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
    timeout: float = 300  # seconds: a case still running then has hung (a failure)
    # a local HTTP server for the case (a BaseHTTPRequestHandler class): "{url}" and "{port}" in
    # `args` become its address; it stops when the case ends
    server: type | None = None
    absent: tuple[str, ...] = ()  # each must NOT appear in stdout + stderr (a guess on the wrong path)
    # requests sent to the server the command starts (`rlhf serve-rm ... --port 0`), each with the
    # status it must get; the command is then stopped with SIGTERM (its own process only)
    probes: tuple[Probe, ...] = ()


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    body: bytes | None = None
    status: int = 400
    headers: tuple[tuple[str, str], ...] = ()  # "{token}" in a value: the token the server printed


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


def sft(*extra: str, data: str = "sft.jsonl", out: str = "out", model: str = "policy") -> list[str]:
    return ["sft", "--model", model, "--data", data, "--out", out, *TINY_SUPERVISED, *extra]


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

# -- the cases of earlier reviews, rerun case by case -----------------------------------
# Each group holds the cases of one earlier pass that the groups above did not have yet: the pass's
# own list is in its issue (16, 28, 40), where only the cases it names can be read back; a case of
# it already above (e.g. `config_is_directory`) is not repeated.


def _tiny_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1"}  # fmt: skip


GRPO_TINY = ["--rollout.batch_size", "4", "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "3",
             "--train.micro_batch_size", "4", "--log.sinks", "jsonl"]  # fmt: skip
CALC_ROWS = jsonl([{"prompt": f"{a} {b}", "answer": k} for k, (a, b) in enumerate(zip(WORDS, WORDS[1:8]))])
# earlier runs the resume cases start from: built once per scratch folder, in a copy of the inputs
BUILDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "train2": (["train", "--preset", "vanilla_ppo", "--policy", "policy", "--reward-model", "rm", "--prompts",
                "prompts.jsonl", "--out", "run", "--train.iterations", "2", "--checkpoint.every", "1",
                *TINY_TRAIN[2:]], {}),
    "dpo2": (["dpo", "--model", "policy", "--data", "pairs.jsonl", "--out", "run", "--train.max_steps", "2",
              "--train.batch_size", "4", "--checkpoint.every", "1", "--sinks", "jsonl"], {}),
    "calc2": (["train", "--preset", "grpo", "--policy", "policy", "--env", "rlhf.envs.calculator:Calculator",
               "--env.max_turns", "2", "--prompts", "calc.jsonl", "--out", "run", "--train.iterations", "2",
               "--checkpoint.every", "1", *GRPO_TINY], {"calc.jsonl": CALC_ROWS}),
}  # fmt: skip


def built(kind: str) -> Callable[[Path], None]:
    """A setup that puts the earlier run BUILDS[kind] (`run/`, and the files it read) into the case's
    directory; it is built once per scratch folder, in a copy of the shared inputs (so this setup
    comes first in `steps`)."""

    def setup(work: Path) -> None:
        cache = work.parent / "_built" / kind
        args, files = BUILDS[kind]
        if not (cache / "run").is_dir():
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(work, cache)
            for name, text in files.items():
                (cache / name).write_text(text)
            done = subprocess.run([sys.executable, "-m", "rlhf", *args], cwd=cache, env=_tiny_env(),
                                  capture_output=True, text=True, timeout=900)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"building {kind} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        shutil.copytree(cache / "run", work / "run")
        for name in files:
            shutil.copy(cache / name, work / name)

    return setup


def edit(name: str, change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        path = work / name
        path.write_bytes(change(path.read_bytes()))

    return setup


def newest_checkpoint_file(pick: Callable[[list[Path]], Path], change: Callable[[bytes], bytes]):
    """A setup that changes one file (chosen by `pick`) of run/'s newest checkpoint."""

    def setup(work: Path) -> None:
        newest = max((work / "run" / "checkpoints").glob("iter_*"), key=lambda p: int(p.name.split("_")[1]))
        path = pick([p for p in newest.iterdir() if p.is_file() and p.name != "DONE"])
        path.write_bytes(change(path.read_bytes()))

    return setup


def largest(paths: list[Path]) -> Path:
    return max(paths, key=lambda p: p.stat().st_size)


def named(name: str) -> Callable[[list[Path]], Path]:
    return lambda paths: next(p for p in paths if p.name == name)


def model_variant(
    target: str, change: Callable[[Path], None], source: str = "policy"
) -> Callable[[Path], None]:
    """A copy of the model directory `source` as `target`, then `change(target_dir)`."""

    def setup(work: Path) -> None:
        shutil.copytree(work / source, work / target)
        change(work / target)

    return setup


def _config_json(update: dict) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        config.update(update)
        (directory / "config.json").write_text(json.dumps(config))

    return change


def _as_pickle(directory: Path) -> None:
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(str(directory / "model.safetensors")), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def _nan_weights(directory: Path) -> None:
    from safetensors.torch import load_file, save_file

    for path in directory.glob("*.safetensors"):
        tensors = load_file(str(path))
        save_file({k: v.float().fill_(float("nan")) for k, v in tensors.items()}, str(path))


def other_tokenizer(target: str, reward_model: bool) -> Callable[[Path], None]:
    """A tiny model saved with a tokenizer of the same size but other words (upper case)."""

    def setup(work: Path) -> None:
        from rlhf.models.scalar_head import ScalarHeadModel
        from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

        tok = word_tokenizer([" ".join(w.upper() for w in WORDS)])
        model = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
        if reward_model:
            model = ScalarHeadModel.from_causal_lm(model, head_init_std=0.5)
        model.save_pretrained(work / target)
        tok.save_pretrained(work / target)

    return setup


def fifo(name: str) -> Callable[[Path], None]:
    return lambda work: os.mkfifo(work / name)


def dpo(*extra: str, data: str = "pairs.jsonl", out: str = "out", model: str = "policy") -> list[str]:
    return ["dpo", "--model", model, "--data", data, "--out", out, *TINY_SUPERVISED, *extra]


def rm(*extra: str, data: str = "pairs.jsonl", out: str = "out", model: str = "policy") -> list[str]:
    return ["rm", "--model", model, "--data", data, "--out", out, *TINY_SUPERVISED, *extra]


def evaluate(*extra: str, judge: str = "rm") -> list[str]:
    return ["eval", "--policy", "policy", "--baseline", "policy", "--judge", judge, "--prompts", "prompts.jsonl",
            "--n", "2", "--max-new-tokens", "2", *extra]  # fmt: skip


def grpo(*extra: str, prompts: str = "prompts.jsonl", out: str = "out", preset: str = "grpo") -> list[str]:
    return ["train", "--preset", preset, "--policy", "policy", "--prompts", prompts, "--out", out,
            "--train.iterations", "1", *GRPO_TINY, *extra]  # fmt: skip


def fn_module(name: str, body: str) -> Callable[[Path], None]:
    return write(f"{name}.py", body)


def needs_package(module: str) -> Callable[[], str | None]:
    import importlib.util

    return lambda: None if importlib.util.find_spec(module) else f"{module} is not installed here"


def no_package(module: str) -> Callable[[], str | None]:
    import importlib.util

    return lambda: f"{module} is installed here" if importlib.util.find_spec(module) else None


LONG_PROMPTS = jsonl([{"prompt": " ".join(WORDS * 40)}] * 4)
LONG_PAIRS = jsonl([{"prompt": " ".join(WORDS * 40), "chosen": "t a", "rejected": "a b"}] * 4)
USER_FILES = ("policy", "rm", "sft.jsonl", "pairs.jsonl", "prompts.jsonl")
# what a resume with nothing left to do must leave byte-identical; it writes the final checkpoint
# again, with equal tensors (its safetensors files' bytes may differ: their header's order)
FINISHED_RUN = ("run/config.yaml", "run/run_inputs.json", "run/metrics.jsonl", "run/model.safetensors",
                "run/config.json")  # fmt: skip

# the run directory, resume and signals: the ones that need a second process, a signal or a
# full disk are the reliability suite's own tests (tests/reliability: test_run_dir_lock,
# test_sigterm, test_signal_during_write; ENOSPC simulated in test_cli_error_path) and those of
# rlhf/rundir (tests/rundir: test_rundir_lock, test_rundir_termination, test_rundir_checkpoint_export)
RUN_DIR_AND_RESUME = [
    *(Case(f"resume_override_{name}", ["train", "--resume", "run", *flag], words=(key, "Fix"),
           setup=built("train2")) for name, flag, key in [
        ("kl_beta", ["--kl.beta", "0.5"], "kl.beta"),
        ("policy_lr", ["--policy_optim.lr", "0.5"], "policy_optim.lr"),
        ("reward_model", ["--reward-model", "rm2"], "model.reward_model"),
        ("preset", ["--preset", "ppo_max"], "preset ('vanilla_ppo' -> 'ppo_max')"),
        ("critic_mode", ["--model.critic_mode", "shared"], "model.critic_mode"),
    ]),
    Case("resume_config_yaml_error", ["train", "--resume", "run", "--config", "c.yaml"], words=("c.yaml",),
         setup=steps(built("train2"), write("c.yaml", "kl: [1,\n"))),
    Case("resume_truncated_newest_checkpoint", ["train", "--resume", "run", "--train.iterations", "3"], code=0,
         words=("skipping damaged checkpoint run/checkpoints/iter_000002",), setup=steps(built("train2"), newest_checkpoint_file(largest, lambda b: b[:64])),
         unchanged=USER_FILES),
    Case("resume_edited_trainer_state", ["train", "--resume", "run", "--train.iterations", "3"], code=0,
         words=("skipping damaged checkpoint run/checkpoints/iter_000002",), unchanged=USER_FILES,
         setup=steps(built("train2"), newest_checkpoint_file(named("trainer.json"), lambda b: b + b" "))),
    Case("model_auto_map_refused", sft(model="remote"), words=("auto_map", "--trust-remote-code"),
         setup=steps(copy_model("policy", "remote"),
                     write("remote/modeling_evil.py", "raise SystemExit(7)\n"),
                     lambda w: _config_json({"auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}})(w / "remote")),
         ),
    Case("model_pickle_weights_refused",
         ["sft", "--model", "pkl", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
         words=("pkl", "--allow-pickle"), setup=model_variant("pkl", _as_pickle)),
    Case("model_unknown_architecture",
         ["sft", "--model", "alien", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
         words=("alien", "nosucharch"),
         setup=model_variant("alien", _config_json({"model_type": "nosucharch", "architectures": ["NoSuch"]}))),
    Case("train_prompt_longer_than_positions", train("--data.max_prompt_tokens", "4000", "--prompts", "long.jsonl"),
         words=("long.jsonl", "Fix"), setup=write("long.jsonl", LONG_PROMPTS)),
    Case("log_every_zero", train("--log.every", "0"), words=("log.every", "0")),
    Case("sft_micro_batch_zero", sft("--train.micro_batch_size", "0"), words=("train.micro_batch_size", "0")),
    Case("stop_at_eos_false_truncated_drop", train("--rollout.stop_at_eos", "false", "--rollout.truncated", "drop"),
         words=("rollout.truncated", "Fix")),
    Case("eval_temperature_zero_is_greedy", evaluate("--temperature", "0", "--out", "e.json"), code=0),
    Case("report_on_a_train_run", ["report", "run"], code=0, setup=built("train2"), unchanged=USER_FILES),
    Case("report_on_a_folder_that_is_no_run", ["report", "emptyrun"], words=("emptyrun",),
         setup=lambda w: (w / "emptyrun").mkdir()),
    Case("report_on_a_model_dir", ["report", "policy"], words=("policy",)),
    Case("nan_reward_model", train(), words=("rm", "Fix"),
         setup=lambda w: _nan_weights(w / "rm")),
    Case("negative_iterations", train("--train.iterations", "-3"), words=("train.iterations", "-3")),
    Case("sft_batch_size_zero", sft("--train.batch_size", "0"), words=("train.batch_size", "0")),
    Case("tiny_temperature_warns", train("--rollout.temperature", "1e-6"), code=0, words=("temperature",)),
    Case("eval_nan_judge", evaluate("--out", "e.json", judge="nanrm"), words=("nanrm",),
         setup=model_variant("nanrm", _nan_weights, source="rm")),
    Case("data_check_skip_invalid", ["data", "check", "mixed.jsonl", "--skip-invalid"], code=0,
         words=("skipped",), setup=write("mixed.jsonl", SFT_TEXT + "{oops\n")),
    Case("data_error_names_a_flag_that_exists", sft(data="mixed.jsonl"), words=("mixed.jsonl:19", "--skip-invalid"),
         setup=write("mixed.jsonl", SFT_TEXT + "{oops\n")),
    Case("sft_skip_invalid_runs", sft("--skip-invalid", data="mixed.jsonl"), code=0,
         setup=write("mixed.jsonl", SFT_TEXT + "{oops\n")),
    Case("eval_skip_invalid_runs", evaluate("--prompts", "mixed.jsonl", "--skip-invalid", "--out", "e.json"), code=0,
         setup=write("mixed.jsonl", jsonl([{"prompt": "a b"}] * 3) + "{oops\n")),
    Case("data_csv_behind_jsonl", sft(data="table.jsonl"), words=("table.jsonl", "CSV"),
         setup=write("table.jsonl", "prompt,response\na b,c t\nb c,d t\n")),
    Case("data_gzip_behind_jsonl_is_read", sft(data="packed.jsonl"), code=0,
         setup=lambda w: (w / "packed.jsonl").write_bytes(__import__("gzip").compress(SFT_TEXT.encode()))),
]  # fmt: skip

# files, rows and token budgets
FILES_AND_ROWS = [
    Case("rm_rows_longer_than_positions",
         rm("--data.max_prompt_tokens", "4000", "--data.max_response_tokens", "4000", data="long.jsonl"),
         words=("long.jsonl", "positions", "Fix"), setup=write("long.jsonl", LONG_PAIRS)),
    Case("dpo_rows_longer_than_positions",
         dpo("--data.max_prompt_tokens", "4000", "--data.max_response_tokens", "4000", data="long.jsonl"),
         words=("long.jsonl", "positions", "Fix"), setup=write("long.jsonl", LONG_PAIRS)),
    Case("reward_fn_returns_1e300", train("--reward-fn", "rf_big:score"), words=("rf_big", "1e+300"),
         setup=fn_module("rf_big", "def score(prompts, completions, **kw):\n    return [1e300] * len(completions)\n")),
    Case("reward_fn_returns_minus_1e39", train("--reward-fn", "rf_neg:score"), words=("rf_neg",),
         setup=fn_module("rf_neg", "def score(prompts, completions, **kw):\n    return [-1e39] * len(completions)\n")),
    Case("reward_fn_wrong_count", train("--reward-fn", "rf_one:score"), words=("rf_one",),
         setup=fn_module("rf_one", "def score(completions, **kw):\n    return [1.0]\n")),
    Case("reward_fn_returns_text", train("--reward-fn", "rf_text:score"), words=("rf_text",),
         setup=fn_module("rf_text", "def score(completions, **kw):\n    return ['good'] * len(completions)\n")),
    Case("reward_fn_raises", train("--reward-fn", "rf_raise:score"), words=("rf_raise", "ValueError"),
         setup=fn_module("rf_raise", "def score(completions, **kw):\n    raise ValueError('no')\n")),
    Case("reward_fn_keyboard_interrupt", train("--reward-fn", "rf_kbd:score"), words=("rf_kbd",),
         setup=fn_module("rf_kbd", "def score(completions, **kw):\n    raise KeyboardInterrupt\n")),
    Case("reward_fn_import_error", train("--reward-fn", "rf_imp:score"), words=("rf_imp",),
         setup=fn_module("rf_imp", "import no_such_package_here\n\ndef score(completions, **kw):\n    return 0\n")),
    Case("reward_fn_trl_prompts_completions", train("--reward-fn", "rf_trl:reward"), code=0,
         setup=fn_module("rf_trl", "def reward(prompts, completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n")),
    Case("reward_fn_trl_completions_only", train("--reward-fn", "rf_trl1:reward"), code=0,
         setup=fn_module("rf_trl1", "def reward(completions, **kwargs):\n    return [0.5 for c in completions]\n")),
    Case("reward_fn_row_field_as_keyword",
         train("--reward-fn", "rf_kw:reward", "--prompts", "topics.jsonl"), code=0,
         setup=steps(write("topics.jsonl", jsonl([{"prompt": f"{a} b", "topic": a} for a in WORDS[:8]])),
                     fn_module("rf_kw", "def reward(completions, topic, **kw):\n"
                                        "    return [float(t in c) for c, t in zip(completions, topic)]\n"))),
    Case("train_foreign_tokenizer_reward_model", train("--reward-model", "frm"), words=("frm", "Fix"),
         setup=other_tokenizer("frm", reward_model=True)),
    Case("resume_reference_model_changed", ["train", "--resume", "run"],
         words=("config.json", "--resume-allow-changed-models"),
         setup=steps(built("train2"), edit("policy/config.json", lambda b: b + b"\n"))),
    Case("resume_config_yaml_edited_by_hand", ["train", "--resume", "run", "--train.iterations", "3"],
         words=("config.yaml", "kl"),
         setup=steps(built("train2"), edit("run/config.yaml", lambda b: b.replace(b"beta: ", b"beta: 0.7", 1)
                                           if b"beta: 0.7" not in b else b))),
    Case("resume_that_changes_nothing", ["train", "--resume", "run", "--train.iterations", "2"], code=0,
         setup=built("train2"), unchanged=(*USER_FILES, *FINISHED_RUN)),
    Case("eval_out_read_only", evaluate("--out", "/proc/rlhf-misuse/eval.json"), words=("/proc/rlhf-misuse/eval.json",)),
    Case("data_json_nested_deep", sft(data="deep.jsonl"), words=("deep.jsonl",),
         setup=write("deep.jsonl", "[" * 100000 + "]" * 100000 + "\n")),
    Case("yaml_scientific_lr_is_a_number", sft("--config", "c.yaml"), code=0,
         setup=write("c.yaml", "optim:\n  lr: 1e-3\n")),
    Case("data_json_gzip_garbage", sft(data="d.json"), words=("d.json",),
         setup=write("d.json", b"\x1f\x8b\x08\x00garbage")),
    Case("data_check_gzip_garbage", ["data", "check", "d.jsonl.gz"], words=("d.jsonl.gz",),
         setup=write("d.jsonl.gz", b"\x1f\x8b\x08\x00garbage")),
    Case("model_typo_dir", ["sft", "--model", "polcy", "--data", "sft.jsonl", "--out", "out", *TINY_SUPERVISED],
         words=("polcy", "Fix"), timeout=90),
    Case("eval_baseline_foreign_tokenizer",
         ["eval", "--policy", "policy", "--baseline", "fpol", "--judge", "rm", "--prompts", "prompts.jsonl",
          "--n", "2", "--max-new-tokens", "2", "--out", "e.json"], words=("fpol",),
         setup=other_tokenizer("fpol", reward_model=False)),
    Case("sft_out_inside_model", sft(out="policy/run"), words=("--out policy/run", "--model")),
    Case("rm_out_is_model", rm(out="policy"), words=("--out policy", "--model")),
    Case("dpo_out_is_model", dpo(out="policy"), words=("--out policy", "--model")),
]  # fmt: skip

# inputs, sinks and judges
INPUTS_AND_SINKS = [
    Case("resume_fewer_iterations_than_done", ["train", "--resume", "run", "--train.iterations", "1"],
         words=("train.iterations 1", "2 iterations"), setup=built("train2")),
    Case("wandb_sink_without_package", sft("--sinks", "[console,wandb]"), words=("wandb", "pip install"),
         skip=no_package("wandb")),
    Case("eval_world_judge_missing", evaluate("--out", "e.json", judge="world:nowhere"), words=("world:nowhere",)),
    Case("sft_data_and_data_path", sft("--data.path", "pairs.jsonl"), words=("--data", "--data.path")),
    Case("demo_seeds_zero", ["demo", "--seeds", "0", "--out", "d"], words=("--seeds", "0")),
    Case("rm_eval_n_zero", ["rm-eval", "--reward-model", "rm", "--data", "pairs.jsonl", "--n", "0"], words=("n", "0")),
    Case("eval_n_zero", evaluate("--n", "0"), words=("n must be >= 1",)),
]  # fmt: skip

# --out paths and what they hold
OUT_PATHS = [
    Case("dpo_out_holds_its_config", dpo("--config", "proj/config.yaml", out="proj"),
         words=("--out proj", "--config", "Fix"),
         setup=steps(write("proj/config.yaml", "train:\n  max_steps: 1\n"), write("proj/report.html", "<p>mine</p>\n"))),
    Case("sft_out_is_another_model", sft(out="rm"), words=("--out rm", "Fix")),
    Case("dpo_out_is_another_model", dpo(out="rm"), words=("--out rm", "Fix")),
    Case("eval_second_judge_foreign", evaluate("--judge", "frm", "--out", "e.json"), words=("frm",),
         setup=other_tokenizer("frm", reward_model=True)),
    Case("dpo_resume_model_changed", ["dpo", "--resume", "run"],
         words=("config.json", "--resume-allow-changed-models"),
         setup=steps(built("dpo2"), edit("policy/config.json", lambda b: b + b"\n"))),
    Case("rm_eval_read_only_model_folder", ["rm-eval", "--reward-model", "rm", "--data", "pairs.jsonl"],
         words=("rm_eval.json",), setup=lambda w: os.chmod(w / "rm", 0o555), skip=as_root),
    Case("ray_address_that_does_not_answer", train("--dist.runtime", "ray", "--ray.address", "127.0.0.1:1"),
         words=("ray.address", "127.0.0.1:1"), timeout=60, skip=needs_package("ray")),
    Case("plan_gpu_memory_without_unit", ["plan", "--model", "7b", "--gpu-memory", "80"], words=("80GB",)),
    Case("dpo_data_is_a_fifo", dpo(data="pipe.jsonl"), words=("pipe.jsonl", "FIFO"), setup=fifo("pipe.jsonl"),
         timeout=60),
    Case("rm_eval_huge_bins", ["rm-eval", "--reward-model", "rm", "--data", "pairs.jsonl", "--histogram-bins",
                               "1000000000"], words=("histogram_bins",), timeout=60),
    Case("tensorboard_sink_without_package", sft("--sinks", "[tensorboard]"), words=("tensorboard", "pip install"),
         skip=no_package("tensorboard")),
    Case("train_policy_and_model_policy", train("--model.policy", "rm"), words=("--policy", "--model.policy")),
    Case("ablate_out_project_folder", ["ablate", "--out", "proj", "--seeds", "1"], words=("--out proj", "Fix"),
         setup=write("proj/notes.txt", "mine\n")),
    Case("ablate_out_holds_its_config", ["ablate", "--out", "proj", "--config", "proj/demo.yaml"],
         words=("--config", "Fix"), setup=write("proj/demo.yaml", "iterations: 1\n")),
    Case("ablate_out_another_model", ["ablate", "--out", "rm"], words=("model directory", "Fix")),
    Case("ablate_out_existing_file", ["ablate", "--out", "notes.txt"], words=("existing file", "Fix"),
         setup=write("notes.txt", "mine\n")),
    Case("demo_out_another_model", ["demo", "--out", "rm"], words=("model directory", "Fix")),
]  # fmt: skip


# -- the newest surfaces --------------------------------------
class _Health(__import__("http.server").server.BaseHTTPRequestHandler):
    """A reward server's /health; POST /score answered by `score` (overridden below)."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, b'{"status": "ok", "wire": 1, "tokenizer": null}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        rows = len(json.loads(self.rfile.read(length) or b"{}").get("responses", []))
        status, body = self.score(rows)
        self._send(status, body)

    def score(self, rows: int) -> tuple[int, bytes]:
        return 200, json.dumps({"scores": [0.5] * rows}).encode()


class _Garbage(_Health):
    def score(self, rows):
        return 200, b"<html>hello</html>"


class _WrongCount(_Health):
    def score(self, rows):
        return 200, json.dumps({"scores": [0.5] * (rows + 1)}).encode()


class _NaN(_Health):
    def score(self, rows):
        return 200, b'{"scores": [' + b", ".join([b"NaN"] * rows) + b"]}"


class _Fails(_Health):
    def score(self, rows):
        return 500, b'{"error": "model crashed"}'


class _Refuses(_Health):
    def score(self, rows):
        return 400, b'{"error": "bad request: no such field"}'


class _Sleeps(_Health):
    def score(self, rows):
        time.sleep(30)
        return 200, b"{}"


class _Unhealthy(_Health):
    def do_GET(self) -> None:
        self._send(200, b'{"status": "loading"}')


REMOTE = ["--model.critic_init", "policy", "--reward.remote.retries", "0", "--reward.remote.timeout", "2"]


def remote(*extra: str) -> list[str]:
    return ["train", "--preset", "vanilla_ppo", "--policy", "policy", "--reward-url", "{url}", "--prompts",
            "prompts.jsonl", "--out", "out", *TINY_TRAIN, *REMOTE, *extra]  # fmt: skip


def bad_url(url: str) -> list[str]:
    return ["train", "--preset", "grpo", "--policy", "policy", "--reward-url", url, "--prompts", "prompts.jsonl",
            "--out", "out", *GRPO_TINY]  # fmt: skip


ENV_ROWS = steps(write("calc.jsonl", CALC_ROWS))
CALC = "rlhf.envs.calculator:Calculator"


def env_module(name: str, body: str) -> Callable[[Path], None]:
    return write(f"{name}.py", "class Env:\n    def __init__(self, row):\n        self.row = row\n\n" + body)


def env_run(*extra: str, env: str = CALC, prompts: str = "calc.jsonl") -> list[str]:
    return grpo("--env", env, *extra, prompts=prompts)


SURFACES = [
    # --- environments (--env module:Class, rlhf/envs/)
    Case("env_calculator_runs", env_run("--env.max_turns", "2"), code=0, setup=ENV_ROWS),
    Case("env_calculator_rows_without_answer", env_run(prompts="prompts.jsonl"), words=("answer",)),
    Case("env_max_turns_zero", env_run("--env.max_turns", "0"), words=("env.max_turns", "0"), setup=ENV_ROWS),
    Case("env_max_turns_text", env_run("--env.max_turns", "two"), words=("env.max_turns", "two"), setup=ENV_ROWS),
    Case("env_max_tokens_negative", env_run("--env.max_tokens", "-1"), words=("env.max_tokens", "-1"),
         setup=ENV_ROWS),
    Case("env_reward_placement_unknown", env_run("--env.reward_placement", "middle"),
         words=("env.reward_placement", "middle"), setup=ENV_ROWS),
    Case("env_missing_module", env_run(env="rlhf.envs.nosuch:Env"), words=("rlhf.envs.nosuch",), setup=ENV_ROWS),
    Case("env_missing_class", env_run(env="rlhf.envs.calculator:Calc"), words=("Calc",), setup=ENV_ROWS),
    Case("env_guess_target_not_a_number", env_run(env="rlhf.envs.guess:GuessNumber", prompts="g.jsonl"),
         words=("target",), setup=write("g.jsonl", jsonl([{"prompt": "a b", "target": "eleven"}] * 4))),
    Case("env_with_async_rollouts", env_run("--rollout.max_staleness", "1"), words=("rollout.max_staleness",),
         setup=ENV_ROWS),
    Case("env_step_raises", env_run(env="env_raise:Env", prompts="prompts.jsonl"), words=("env_raise",),
         setup=env_module("env_raise", "    def step(self, response):\n        raise RuntimeError('broken tool')\n")),
    Case("env_step_nan_reward", env_run(env="env_nan:Env", prompts="prompts.jsonl"), words=("env_nan",),
         setup=env_module("env_nan", "    def step(self, response):\n        return None, float('nan'), True\n")),
    Case("env_init_raises", env_run(env="env_init:Env", prompts="prompts.jsonl"), words=("env_init",),
         setup=write("env_init.py", "class Env:\n    def __init__(self, row):\n        raise KeyError('level')\n\n"
                                    "    def step(self, response):\n        return None, 0.0, True\n")),
    Case("env_never_done_stops_at_max_turns", env_run("--env.max_turns", "2", env="env_loop:Env",
                                                      prompts="prompts.jsonl"), code=0,
         setup=env_module("env_loop", "    def step(self, response):\n        return 'a b', 0.0, False\n")),
    Case("env_long_reply_cut_at_max_tokens", env_run("--env.max_tokens", "8", env="env_long:Env",
                                                     prompts="prompts.jsonl"), code=0,
         setup=env_module("env_long", "    def step(self, response):\n        return 'a b c ' * 200, 0.0, False\n")),
    Case("env_resume_changes_max_turns", ["train", "--resume", "run", "--env.max_turns", "3"],
         words=("env.max_turns",), setup=built("calc2")),
    Case("env_resume_fewer_iterations", ["train", "--resume", "run", "--train.iterations", "1"],
         words=("train.iterations 1",), setup=built("calc2")),
    # --- DAPO (--preset dapo, rollout.dynamic_sampling, max_sampling_rounds, reward.overlong_buffer)
    Case("dapo_one_sample_per_prompt", grpo("--reward-model", "rm", "--rollout.samples_per_prompt", "1", preset="dapo"),
         words=("rollout.samples_per_prompt", "Fix")),
    Case("dapo_zero_sampling_rounds", grpo("--reward-model", "rm", "--rollout.max_sampling_rounds", "0", preset="dapo"),
         words=("rollout.max_sampling_rounds", "0")),
    Case("dapo_overlong_buffer_above_1", grpo("--reward-model", "rm", "--reward.overlong_buffer", "1.5", preset="dapo"),
         words=("reward.overlong_buffer", "1.5")),
    Case("dapo_overlong_buffer_negative", grpo("--reward-model", "rm", "--reward.overlong_buffer", "-0.1",
                                               preset="dapo"), words=("reward.overlong_buffer", "-0.1")),
    Case("dapo_penalty_factor_negative", grpo("--reward-model", "rm", "--reward.overlong_penalty_factor", "-1",
                                              preset="dapo"), words=("reward.overlong_penalty_factor", "-1")),
    Case("dapo_with_async_rollouts", grpo("--reward-model", "rm", "--rollout.max_staleness", "1", preset="dapo"),
         words=("rollout.max_staleness",)),
    Case("dapo_runs", grpo("--reward-model", "rm", "--reward.overlong_buffer", "0.5", preset="dapo"), code=0),
    Case("dapo_constant_reward_keeps_no_group",
         grpo("--reward-fn", "rf_flat:score", "--rollout.max_sampling_rounds", "2", preset="dapo"), code=0,
         words=("dynamic_sampling",),
         setup=fn_module("rf_flat", "def score(completions, **kw):\n    return [1.0] * len(completions)\n")),
    # --- the reward server and its client
    Case("reward_url_ftp", bad_url("ftp://127.0.0.1:8000"), words=("reward.remote.url", "ftp://", "Fix")),
    Case("reward_url_no_host", bad_url("http://"), words=("reward.remote.url", "Fix")),
    Case("reward_url_port_out_of_range", bad_url("http://127.0.0.1:99999"), words=("99999", "Fix")),
    Case("reward_url_with_query", bad_url("http://127.0.0.1:8000/?model=x"), words=("query", "Fix")),
    Case("reward_url_and_reward_model", bad_url("http://127.0.0.1:8000") + ["--reward-model", "rm"],
         words=("--reward-model", "--reward-url")),
    Case("reward_url_nothing_listens", [*bad_url("http://127.0.0.1:9"), "--reward.remote.retries", "0"], words=("http://127.0.0.1:9", "Fix"), timeout=60),
    Case("reward_server_answers_garbage", remote(), words=("{url}", "JSON"), server=_Garbage, timeout=120),
    Case("reward_server_wrong_count", remote(), words=("scores for",), server=_WrongCount, timeout=120),
    Case("reward_server_nan", remote(), words=("NaN", "finite"), server=_NaN, timeout=120),
    Case("reward_server_500", remote(), words=("500", "model crashed"), server=_Fails, timeout=120),
    Case("reward_server_400", remote(), words=("400", "no such field"), server=_Refuses, timeout=120),
    Case("reward_server_hangs", remote(), words=("no answer within reward.remote.timeout 2 s",), server=_Sleeps, timeout=120),
    Case("reward_server_not_ready", remote(), words=("/health", "loading"), server=_Unhealthy, timeout=60),
    Case("reward_server_good_runs", remote(), code=0, server=_Health, timeout=200),
    Case("serve_rm_missing_dir", ["serve-rm", "--reward-model", "nope", "--port", "0"], words=("nope",), timeout=60),
    Case("serve_rm_policy_dir", ["serve-rm", "--reward-model", "policy", "--port", "0"], words=("policy",),
         timeout=60),
    Case("serve_rm_port_in_use", ["serve-rm", "--reward-model", "rm", "--port", "{port}"],
         words=("{port}", "Fix"), server=_Health, timeout=90),
    Case("serve_rm_port_out_of_range", ["serve-rm", "--reward-model", "rm", "--port", "70000"],
         words=("70000",), timeout=60),
    Case("serve_rm_batch_size_zero", ["serve-rm", "--reward-model", "rm", "--batch-size", "0"],
         words=("--batch-size", "0"), timeout=60),
    Case("serve_rm_host_unresolvable", ["serve-rm", "--reward-model", "rm", "--host", "no-such-host.invalid",
                                        "--port", "0"], words=("no-such-host.invalid",), timeout=90),
    Case("serve_rm_port_text", ["serve-rm", "--reward-model", "rm", "--port", "http"], words=("--port",)),
    # --- verifiers (--reward-fn rlhf.rl.verifiers:...)
    Case("verifier_rows_without_answer", grpo("--reward-fn", "rlhf.rl.verifiers:exact_answer"), words=("answer",)),
    Case("verifier_unknown_function", grpo("--reward-fn", "rlhf.rl.verifiers:exact"), words=("exact",)),
    Case("verifier_exact_answer_runs", grpo("--reward-fn", "rlhf.rl.verifiers:exact_answer", prompts="calc.jsonl"),
         code=0, setup=ENV_ROWS),
    Case("verifier_math_answer_runs", grpo("--reward-fn", "rlhf.rl.verifiers:math_answer", prompts="calc.jsonl"),
         code=0, setup=ENV_ROWS),
    Case("verifier_format_and_length_run", grpo("--reward-fn", "rlhf.rl.verifiers:answer_tag_format",
                                                "--reward-fn", "rlhf.rl.verifiers:length_penalty"), code=0),
    Case("verifier_answer_null", grpo("--reward-fn", "rlhf.rl.verifiers:exact_answer", prompts="null.jsonl"),
         code=0, setup=write("null.jsonl", jsonl([{"prompt": "a b", "answer": None}] * 4))),
    # --- rlhf eval --pairs
    Case("pairs_missing_file", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "nope.jsonl"],
         words=("nope.jsonl",)),
    Case("pairs_empty_file", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "e.jsonl",
                              "--out", "r.json"], words=("e.jsonl",), setup=write("e.jsonl", "")),
    Case("pairs_wrong_keys", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "w.jsonl",
                              "--out", "r.json"], words=("w.jsonl", "chosen"),
         setup=write("w.jsonl", jsonl([{"prompt": "a", "good": "b", "bad": "c"}] * 3))),
    Case("pairs_n_zero", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "pairs.jsonl",
                          "--pairs-n", "0"], words=("pairs_n", "0")),
    Case("pairs_n_negative", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "pairs.jsonl",
                              "--pairs-n", "-2"], words=("pairs_n", "-2")),
    Case("pairs_n_text", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "pairs.jsonl",
                          "--pairs-n", "all"], words=("pairs_n", "all")),
    Case("pairs_without_baseline", ["eval", "--policy", "policy", "--pairs", "pairs.jsonl"], words=("--baseline",)),
    Case("pairs_binary_file", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "b.jsonl",
                               "--out", "r.json"], words=("b.jsonl",), setup=write("b.jsonl", bytes(range(256)))),
    Case("pairs_runs", ["eval", "--policy", "policy", "--baseline", "policy", "--pairs", "pairs.jsonl",
                        "--pairs-n", "4", "--out", "r.json"], code=0),
    # --- train.micro_batch_tokens
    Case("micro_batch_tokens_negative", sft("--train.micro_batch_tokens", "-1"),
         words=("train.micro_batch_tokens", "-1")),
    Case("micro_batch_tokens_text", train("--train.micro_batch_tokens", "lots"),
         words=("train.micro_batch_tokens", "lots")),
    Case("micro_batch_tokens_float", dpo("--train.micro_batch_tokens", "2.5"),
         words=("train.micro_batch_tokens", "2.5")),
    Case("micro_batch_tokens_1_sft_runs", sft("--train.micro_batch_tokens", "1"), code=0),
    Case("micro_batch_tokens_3_train_runs", train("--train.micro_batch_tokens", "3"), code=0),
    Case("micro_batch_tokens_4_rm_runs", rm("--train.micro_batch_tokens", "4"), code=0),
    # --- train.compile
    Case("compile_under_fsdp2", sft("--train.compile", "true", "--dist.strategy", "fsdp2"),
         words=("train.compile", "fsdp2", "Fix")),
    Case("compile_backend_unknown", train("--train.compile", "true", "--train.compile_backend", "fast"),
         words=("train.compile_backend", "fast", "inductor")),
    Case("compile_text", dpo("--train.compile", "often"), words=("train.compile", "often")),
    # --- rollout.engine
    Case("engine_cuda_graph_on_cpu", train("--rollout.engine", "cuda_graph"), words=("cuda_graph", "Fix")),
    Case("engine_unknown", train("--rollout.engine", "turbo"), words=("rollout.engine", "turbo")),
    Case("engine_static_on_cpu_runs", train("--rollout.engine", "static"), code=0),
    # --- rlhf plan
    Case("plan_unknown_model", ["plan", "--model", "8b-nope"], words=("8b-nope",)),
    Case("plan_model_dir_without_config", ["plan", "--model", "emptydir"], words=("emptydir",),
         setup=lambda w: (w / "emptydir").mkdir()),
    Case("plan_model_config_not_json", ["plan", "--model", "badconf"], words=("badconf",),
         setup=write("badconf/config.json", "{nope")),
    Case("plan_tiny_model_dir", ["plan", "--model", "policy", "--gpus", "1", "--gpu-memory", "1GB", "--prompt-tokens",
                                "64", "--response-tokens", "64"], code=0),
    Case("plan_gpu_memory_zero", ["plan", "--model", "7b", "--gpu-memory", "0GB"], words=("--gpu-memory",)),
    Case("plan_gpu_memory_text", ["plan", "--model", "7b", "--gpu-memory", "lots"], words=("--gpu-memory", "lots")),
    Case("plan_unknown_preset", ["plan", "--model", "7b", "--preset", "ppo_maxx"], words=("ppo_maxx",)),
    Case("plan_unknown_strategy", ["plan", "--model", "7b", "--strategy", "zero3"], words=("zero3", "Fix: --strategy")),
    Case("plan_unknown_dtype", ["plan", "--model", "7b", "--dtype", "float8"], words=("float8", "Fix: --dtype")),
    Case("plan_unknown_rollout_gather", ["plan", "--model", "7b", "--rollout-gather", "some"], words=("some", "Fix: --rollout-gather")),
    Case("plan_lora_rank_zero", ["plan", "--model", "7b", "--lora", "--lora-rank", "0"], words=("--lora-rank",)),
    Case("plan_extra_argument", ["plan", "--model", "7b", "--iterations", "3"], words=("--iterations",)),
    Case("plan_critic_free_preset", ["plan", "--model", "7b", "--preset", "grpo", "--json"], code=0),
]  # fmt: skip

# -- the classes of config mistakes: each class closed by its mechanism (rlhf/config/keys.py declarations,
# the loader's owner of a key, rlhf/rundir/out_path.py's classification), proven by cases of each class


def run_of(stage: str, metrics: bool = True) -> Callable[[Path], None]:
    """A setup that writes run/ as a run of `stage` left it: its config.yaml (the stage's defaults)
    and, with `metrics`, a metrics line."""

    def setup(work: Path) -> None:
        from rlhf.config import save_config
        from rlhf.config.stages import STAGE_CONFIGS

        (work / "run").mkdir()
        save_config(STAGE_CONFIGS[stage](), work / "run" / "config.yaml")
        if metrics:
            (work / "run" / "metrics.jsonl").write_text('{"step": 0}\n')

    return setup


def dangling(name: str, target: str = "gone/run") -> Callable[[Path], None]:
    return lambda work: os.symlink(target, work / name)


# a setting that cannot apply, set explicitly (flag or --config file): exit 2 naming the key and the condition
CLASS_INAPPLICABLE = [
    Case("ray_actors_without_ray", train("--ray.rollout.num_actors", "2"),
         words=("ray.rollout.num_actors applies only when dist.runtime ray", "Fix: --dist.runtime ray")),
    Case("env_max_turns_without_env", train("--env.max_turns", "3"),
         words=("env.max_turns applies only when --env MODULE:Class", "Fix: --env MODULE:Class")),
    Case("lora_rank_without_lora", sft("--lora.r", "4"), words=("lora.r applies only when lora.enabled true",)),
    Case("simpo_gamma_with_sigmoid", dpo("--dpo.simpo_gamma", "1.0"),
         words=("dpo.simpo_gamma applies only when dpo.loss simpo", "Fix: --dpo.loss simpo")),
    Case("rm_token_budget_with_pair_batching", rm("--train.max_tokens", "4096"),
         words=("train.max_tokens applies only when train.batching tokens",)),
    Case("kl_target_without_adaptive", train("--kl.target", "3"), words=("kl.target applies only when kl.adaptive true",)),
    Case("critic_lr_with_grpo", grpo("--critic_optim.lr", "1e-5"),
         words=("critic_optim.lr applies only when advantage.estimator uses a critic", "grpo")),
    Case("is_truncation_synchronous", train("--policy.is_truncation", "3"),
         words=("policy.is_truncation applies only when rollout.max_staleness > 0",)),
    Case("remote_timeout_without_url", train("--reward.remote.timeout", "5"),
         words=("reward.remote.timeout applies only when --reward-url URL",)),
    Case("min_lr_ratio_with_constant_schedule", train("--policy_optim.min_lr_ratio", "0.1"),
         words=("policy_optim.min_lr_ratio applies only when policy_optim.schedule is one of cosine, linear",)),
    Case("inapplicable_key_in_config_file", sft("--config", "c.yaml"), setup=write("c.yaml", "lora: {alpha: 32}\n"),
         words=("c.yaml: lora.alpha applies only when lora.enabled true", "remove lora.alpha from c.yaml")),
]  # fmt: skip

# a value outside its meaningful range (or non-finite): exit 2 naming the key, its bound and a fix
CLASS_RANGE = [
    Case("is_truncation_below_one", train("--rollout.max_staleness", "1", "--policy.is_truncation", "0.5"),
         words=("policy.is_truncation must be >= 1", "got 0.5", "Fix: --policy.is_truncation 2.0")),
    Case("dpo_beta_huge", dpo("--dpo.beta", "1e30"), words=("dpo.beta must be in (0, 100]", "Fix: --dpo.beta 0.1")),
    Case("lr_above_one", sft("--optim.lr", "5"), words=("optim.lr must be in (0, 1)", "Fix: --optim.lr")),
    Case("clip_eps_above_one", train("--policy.clip_eps", "1.5"), words=("policy.clip_eps must be in (0, 1)",)),
    Case("kl_beta_not_a_number", train("--kl.beta", ".nan"), words=("kl.beta must be a finite number in [0, 10]",)),
    Case("temperature_huge", train("--rollout.temperature", "1e6"), words=("rollout.temperature must be in (0, 10]",)),
    Case("label_smoothing_half", dpo("--dpo.label_smoothing", "0.5"), words=("dpo.label_smoothing must be in [0, 0.5)",)),
    Case("range_in_config_file", dpo("--config", "c.yaml"), setup=write("c.yaml", "dpo: {beta: -1}\n"),
         words=("c.yaml: dpo.beta must be in (0, 100]",)),
]  # fmt: skip

# a message that must send the user the right way: the stage that owns a key, the command that resumes a
# run, what an --out is
CLASS_WRONG_WAY = [
    Case("dpo_with_a_train_key", dpo("--kl.beta", "0.1"), words=("kl.beta is a key of `rlhf train`, not of `rlhf dpo`",)),
    Case("sft_with_a_rollout_key", sft("--rollout.temperature", "0.7"),
         words=("rollout.temperature is a key of `rlhf train` and `rlhf eval`, not of `rlhf sft`",)),
    Case("rm_with_a_dpo_key_in_config_file", rm("--config", "c.yaml"), setup=write("c.yaml", "dpo: {beta: 0.2}\n"),
         words=("c.yaml: dpo.beta is a key of `rlhf dpo`, not of `rlhf rm`",)),
    Case("dpo_resume_of_a_train_run", ["dpo", "--resume", "run"], setup=run_of("train"),
         words=("run is a run of `rlhf train`, not of `rlhf dpo`", "rlhf train --resume run")),
    Case("train_resume_of_a_dpo_run", ["train", "--resume", "run"], setup=run_of("dpo"),
         words=("run is a run of `rlhf dpo`, not of `rlhf train`", "rlhf dpo --resume run")),
    Case("dpo_resume_of_an_sft_run", ["dpo", "--resume", "run"], setup=run_of("sft"),
         words=("run is a run of `rlhf sft`", "cannot be resumed")),
    Case("out_is_a_dangling_link", sft(out="link"), setup=dangling("link"),
         words=("--out link is a symbolic link to gone/run, which does not exist", "Fix: create gone/run")),
    Case("out_is_a_run_of_another_stage", train(out="run"), setup=run_of("sft"),
         words=("--out run is a run directory of `rlhf sft`, not of `rlhf train`",)),
    Case("dpo_out_is_a_train_run", dpo(out="run"), setup=run_of("train"),
         words=("--out run is a run directory of `rlhf train`", "rlhf train --resume run")),
]  # fmt: skip

CLASSES = {"inapplicable": CLASS_INAPPLICABLE, "range": CLASS_RANGE, "wrong_way": CLASS_WRONG_WAY}


# -- input and server reliability, by class (each class: its named cases, then new ones) -------------


class _ScoresOf(_Health):
    """A reward server answering `self.text` (one `{}` per score) as its scores."""

    text = "0.5"

    def score(self, rows):
        return 200, b'{"scores": [' + ", ".join([self.text] * rows).encode() + b"]}"


class _Huge(_ScoresOf):
    text = "1e39"  # finite in JSON and float64, inf in float32


class _HugeNegative(_ScoresOf):
    text = "-1e39"


class _HugeInteger(_ScoresOf):
    text = "1" + "0" * 400  # 10**400: beyond even float64


class _Overflows(_ScoresOf):
    text = "1e400"  # read as inf


class _RepeatsScores(_Health):
    def score(self, rows):
        return 200, b'{"scores": [' + b", ".join([b"0.5"] * rows) + b'], "scores": []}'


class _Trickles(_Health):
    """Answers one byte every 0.3 s: each read is quick, the whole answer takes far longer than the
    client's timeout (a per-read timeout never fires)."""

    def trickle(self, data: bytes) -> None:
        for byte in data[:200]:  # at most a minute, whatever the client does
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.3)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"scores": [' + b"0.5, " * 60 + b"0.5]}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        self.trickle(body)


class _TricklesHeaders(_Trickles):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: yes\r\n" * 20 + b"Content-Length: 2\r\n\r\n{}")


class _TricklesHealth(_Trickles):
    def do_GET(self) -> None:
        body = b'{"status": "ok", "wire": 1, "tokenizer": null, "pad": "' + b"x" * 100 + b'"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        self.trickle(body)


class _TricklesChunks(_Trickles):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self.trickle(b"".join(b"1\r\n" + bytes([c]) + b"\r\n" for c in b'{"scores": [0.5, 0.5]}'))


def serve(*extra: str) -> list[str]:
    return ["serve-rm", "--reward-model", "rm", "--port", "0", "--device", "cpu", *extra]


def env_reward(name: str, value: str) -> Callable[[Path], None]:
    return env_module(name, f"    def step(self, response):\n        return None, {value}, True\n")


def flat_reward(name: str = "rf_flat") -> Callable[[Path], None]:
    return fn_module(name, "def score(completions, **kw):\n    return [1.0] * len(completions)\n")


def still_run(*extra: str, preset: str = "grpo") -> list[str]:
    """Four iterations of a run whose policy cannot move (a guess must name why), its warnings on the
    console; DAPO's soft overlong punishment off (it would tell truncated responses apart)."""
    return grpo(*extra, "--train.iterations", "4", "--log.sinks", "[jsonl,console]", "--reward.overlong_buffer", "0",
                preset=preset)  # fmt: skip


DEEP = b"[" * 200_000 + b"]" * 200_000
BAD_JSON = (Probe("POST", "/score", b"<html>"), Probe("POST", "/score", b'{"prompts": ["\xff"]}'),
            Probe("POST", "/score", b'{"prompts": ["a"], "responses": ["b"], "prompts": ["c"]}'),
            Probe("GET", "/health", status=200))  # fmt: skip
BAD_SHAPES = (Probe("POST", "/score", b"[1, 2]"), Probe("POST", "/score", b'{"prompts": "a", "responses": ["b"]}'),
              Probe("POST", "/score", b'{"prompts": [1], "responses": [2]}'),
              Probe("POST", "/score", b'{"prompts": ["a"], "responses": ["b", "c"]}'),
              Probe("POST", "/score", b'{"prompts": [' + b"9" * 5000 + b"]}"),
              Probe("POST", "/score", b'{"prompts": ["' + b"a " * 400 + b'"], "responses": ["b"]}'),
              Probe("POST", "/score", b'{"prompts": ["a b"], "responses": ["c"]}', status=200))  # fmt: skip
GOOD = b'{"prompts": ["a b"], "responses": ["c"]}'
TOKEN = "corpus-token-0123456789abcdef"

# valid input refused, invalid input accepted: formats read as their specifications say
INPUT_FORMATS = [
    Case("data_jsonl_duplicate_key", sft(data="d.jsonl"), words=("d.jsonl:2", "'response' is given twice", "Fix"),
         setup=write("d.jsonl", SFT_TEXT[:SFT_TEXT.index("\n") + 1] + '{"prompt": "a", "response": "b", "response": "c"}\n')),
    Case("yaml_merge_key_loads", train("--config", "c.yaml"), code=0,
         setup=write("c.yaml", "policy_optim: &optim\n  lr: 2.0e-6\ncritic_optim:\n  <<: *optim\n  weight_decay: 0.0\n")),
    Case("plan_sequence_longer_than_positions", ["plan", "--model", "7b", "--prompt-tokens", "4000",
                                                 "--response-tokens", "512"], words=("4512", "4096 positions", "Fix")),
    # new
    Case("yaml_merge_key_list_loads", train("--config", "c.yaml"), code=0,
         setup=write("c.yaml", "policy_optim: &p {lr: 2.0e-6, weight_decay: 0.1}\n"
                               "critic_optim:\n  <<: [*p, {max_grad_norm: 0.5}]\n  weight_decay: 0.0\n")),
    Case("yaml_merge_then_duplicate_key", train("--config", "c.yaml"), words=("c.yaml:5", "'lr' is given twice"),
         setup=write("c.yaml", "policy_optim: &p {lr: 2.0e-6}\ncritic_optim:\n  <<: *p\n  lr: 1.0e-5\n  lr: 2.0e-5\n")),
    Case("data_json_duplicate_key", sft(data="d.json"), words=("d.json:3", "'prompt' is given twice"),
         setup=write("d.json", "[\n" + json.dumps(SFT_ROWS[0]) + ',\n{"prompt": "a", "prompt": "b", "response": "c"}\n]\n')),
    Case("prompts_duplicate_key", train("--prompts", "p.jsonl"), words=("p.jsonl:1", "'prompt' is given twice"),
         setup=write("p.jsonl", '{"prompt": "a b", "prompt": "c d"}\n' * 4)),
    Case("data_messages_duplicate_key", sft(data="m.jsonl"), words=("m.jsonl:1", "'content' is given twice"),
         setup=write("m.jsonl", '{"messages": [{"role": "user", "content": "a", "content": "b"}, '
                                '{"role": "assistant", "content": "c"}]}\n' * 4)),
    Case("data_integer_of_5000_digits", sft(data="big.jsonl"), words=("big.jsonl:1", "cannot be read"),
         setup=write("big.jsonl", '{"prompt": "a", "response": "b", "n": ' + "7" * 5000 + "}\n")),
    Case("reward_server_repeats_a_key", remote(), words=("'scores' is given twice",), server=_RepeatsScores, timeout=300),
    Case("plan_model_dir_longer_than_positions", ["plan", "--model", "policy"], words=("1024", "256 positions")),
]  # fmt: skip

# numbers from outside checked after the cast they must survive (float32)
OUTSIDE_NUMBERS = [
    Case("env_reward_1e39", env_run(env="env_e39:Env", prompts="prompts.jsonl"), words=("env_e39", "1e+39", "float32"),
         setup=env_reward("env_e39", "1e39")),
    Case("env_reward_10_pow_400", env_run(env="env_int:Env", prompts="prompts.jsonl"),
         words=("env_int", "401 digits", "float32"), setup=env_reward("env_int", "10**400")),
    Case("reward_server_1e39", remote(), words=("{url}", "1e+39", "float32"), server=_Huge, timeout=300),
    Case("reward_fn_returns_1e39", grpo("--reward-fn", "rf_e39:score"), words=("rf_e39", "1e+39", "float32"),
         setup=fn_module("rf_e39", "def score(completions, **kw):\n    return [1e39] * len(completions)\n")),
    # new
    Case("env_reward_minus_1e39_numpy", env_run(env="env_np:Env", prompts="prompts.jsonl"),
         words=("env_np", "-1e+39", "float32"),
         setup=env_module("env_np", "    def step(self, response):\n        import numpy\n\n"
                                    "        return None, numpy.float64(-1e39), True\n")),
    Case("reward_server_10_pow_400", remote(), words=("{url}", "401 digits"), server=_HugeInteger, timeout=300),
    Case("reward_server_minus_1e39", remote(), words=("{url}", "-1e+39"), server=_HugeNegative, timeout=300),
    Case("reward_server_1e400_is_inf", remote(), words=("{url}", "inf", "not a finite number"), server=_Overflows,
         timeout=300),
    Case("reward_fn_returns_10_pow_400", grpo("--reward-fn", "rf_int:score"), words=("rf_int", "401 digits", "float32"),
         setup=fn_module("rf_int", "def score(completions, **kw):\n    return [10**400] * len(completions)\n")),
    Case("reward_fn_returns_numpy_1e39", grpo("--reward-fn", "rf_np:score"), words=("rf_np", "1e+39", "float32"),
         setup=fn_module("rf_np", "import numpy\n\n\ndef score(completions, **kw):\n"
                                  "    return numpy.full(len(completions), 1e39)\n")),
]  # fmt: skip

# waits that are bounded: the reward client's timeout covers the whole request
BOUNDED_WAITS = [
    Case("reward_server_trickles_its_answer", remote(), words=("no answer within reward.remote.timeout 2 s",),
         server=_Trickles, timeout=300),
    # new
    Case("reward_server_trickles_its_headers", remote(), words=("no answer within reward.remote.timeout 2 s",),
         server=_TricklesHeaders, timeout=300),
    Case("reward_server_trickles_its_health", remote(), words=("GET /health", "no answer within"),
         server=_TricklesHealth, timeout=300),
    Case("reward_server_trickles_chunks", remote(), words=("no answer within reward.remote.timeout 2 s",),
         server=_TricklesChunks, timeout=300),
]  # fmt: skip

# the reward server's own input: every malformed body a 4xx (no traceback), a token off loopback
SERVER_INPUT = [
    Case("serve_rm_body_nested_200000_deep", serve(), code=0, words=("serving",),
         probes=(Probe("POST", "/score", DEEP), Probe("GET", "/health", status=200)), timeout=300),
    Case("serve_rm_off_loopback_requires_a_token", serve("--host", "0.0.0.0"), code=0, words=("token (",),
         probes=(Probe("GET", "/health", status=401), Probe("POST", "/score", GOOD, status=401),
                 Probe("POST", "/score", GOOD, 401, (("Authorization", "Bearer wrong"),)),
                 Probe("POST", "/score", GOOD, 200, (("Authorization", "Bearer {token}"),))), timeout=300),
    # new
    Case("serve_rm_body_not_json", serve(), code=0, words=("serving",), probes=BAD_JSON, timeout=300),
    Case("serve_rm_body_wrong_shapes", serve(), code=0, words=("serving",), probes=BAD_SHAPES, timeout=300),
    Case("serve_rm_body_over_the_limit", serve("--max-body-mb", "0.01"), code=0, words=("serving",),
         probes=(Probe("POST", "/score", b'{"prompts": ["' + b"a " * 20_000 + b'"]}', 413),
                 Probe("POST", "/score", GOOD, 200)), timeout=300),
    Case("serve_rm_token_from_env", serve("--token-env", "RLHF_CORPUS_TOKEN"), code=0, words=("bearer token required",),
         env={"RLHF_CORPUS_TOKEN": TOKEN}, absent=(TOKEN,),
         probes=(Probe("POST", "/score", GOOD, 401), Probe("POST", "/score", GOOD, 200, (("Authorization", f"Bearer {TOKEN}"),))),
         timeout=300),
    Case("serve_rm_token_env_unset", serve("--token-env", "RLHF_NO_SUCH_TOKEN"),
         words=("--token-env RLHF_NO_SUCH_TOKEN", "not set", "Fix"), timeout=200),
    Case("serve_rm_max_body_zero", serve("--max-body-mb", "0"), words=("--max-body-mb", "0"), timeout=200),
    Case("reward_token_env_not_a_name", remote("--reward-token-env", "Bearer abc"),
         words=("reward.remote.token_env", "not the name of an environment variable"), server=_Health, timeout=200),
    Case("reward_token_env_unset", remote("--reward-token-env", "RLHF_NO_SUCH_TOKEN"),
         words=("RLHF_NO_SUCH_TOKEN", "not set"), server=_Health, timeout=200),
]  # fmt: skip

# guesses on the wrong path: the warning of a step with nothing to learn from names what removed it
WRONG_GUESSES = [
    Case("dapo_no_informative_group_names_dynamic_sampling",
         still_run("--reward-fn", "rf_flat:score", "--rollout.max_sampling_rounds", "2", preset="dapo"), code=0,
         words=("dynamic sampling found no group", "--rollout.temperature"), absent=("raise --policy_optim.lr",),
         setup=flat_reward(), timeout=300),
    Case("truncated_drop_removes_every_row_names_max_new_tokens",
         still_run("--reward-model", "rm", "--rollout.truncated", "drop", "--rollout.top_k", "1"), code=0,
         words=("rollout.truncated drop removed every response", "--rollout.max_new_tokens"),
         absent=("raise --policy_optim.lr",), timeout=300),
    Case("grpo_one_reward_per_group_names_temperature", still_run("--reward-fn", "rf_flat:score"), code=0,
         words=("every group scored one reward", "--rollout.temperature", "rollout.max_new_tokens", "policy_optim.lr"),
         setup=flat_reward(), timeout=300),
    # new
    Case("rloo_one_reward_per_group_names_temperature", still_run("--reward-fn", "rf_flat:score", preset="rloo"),
         code=0, words=("every group scored one reward", "--rollout.temperature"), setup=flat_reward(), timeout=300),
    Case("dapo_truncated_drop_names_max_new_tokens",
         still_run("--reward-model", "rm", "--rollout.truncated", "drop", "--rollout.top_k", "1",
                   "--rollout.max_sampling_rounds", "2", preset="dapo"), code=0,
         words=("rollout.truncated drop removed every response",), absent=("raise --policy_optim.lr",), timeout=300),
    Case("grpo_one_reward_with_a_reward_model_names_temperature",
         still_run("--reward-model", "rm", "--reward.model_weight", "0", "--reward-fn", "rf_flat:score"), code=0,
         words=("every group scored one reward",), setup=flat_reward(), timeout=300),
    Case("ppo_tiny_lr_still_blames_the_lr",
         train("--policy_optim.lr", "1e-12", "--train.iterations", "4", "--log.sinks", "[jsonl,console]"), code=0,
         words=("policy_optim.lr 1e-12 is too small",), absent=("every group", "dynamic sampling"), timeout=300),
]  # fmt: skip

GROUPS = {
    "named": NAMED, "new": NEW, "run_dir_and_resume": RUN_DIR_AND_RESUME, "files_and_rows": FILES_AND_ROWS, "inputs_and_sinks": INPUTS_AND_SINKS,
    "out_paths": OUT_PATHS, "surfaces": SURFACES,
    "input_formats": INPUT_FORMATS, "outside_numbers": OUTSIDE_NUMBERS, "bounded_waits": BOUNDED_WAITS,
    "server_input": SERVER_INPUT, "wrong_guesses": WRONG_GUESSES, **CLASSES,
}  # fmt: skip

CASES = [case for group in GROUPS.values() for case in group]


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


class _Hung(BaseException):
    """An in-process case ran past its timeout (raised by SIGALRM in the main thread)."""


@contextlib.contextmanager
def _alarm(timeout: float):
    """Raise _Hung in the main thread after `timeout` seconds (0, or another thread: no limit)."""
    if not timeout > 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def hung(signum, frame):
        raise _Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_process(args: list[str], work: Path) -> tuple[int | None, str, str]:
    """`rlhf.cli.main(args)` in this process, in `work`: (exit code, stdout, stderr); exit code None
    when the case's `_alarm` went off."""
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
            except _Hung:
                code = None
                print("timed out", file=sys.stderr)
    finally:
        os.chdir(cwd)
        # the case's own modules (reward functions, environments) go with it: the next case may
        # have a module of the same name
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(work)):
                del sys.modules[name]
        while str(work) in sys.path:
            sys.path.remove(str(work))
    return code, out.getvalue(), err.getvalue()


def _start_server(handler: type):
    """A ThreadingHTTPServer on a free loopback port answering with `handler`, in a daemon thread."""
    import threading
    from http.server import ThreadingHTTPServer

    class Quiet(ThreadingHTTPServer):
        def handle_error(
            self, request, client_address
        ) -> None:  # a client that hung up: not the case's output
            pass

    server = Quiet(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _probe_server(
    args: list[str], work: Path, env: dict[str, str], probes: tuple[Probe, ...], timeout: float
) -> tuple[int | None, str, str, list[str]]:
    """Start the server command, send each probe once it says where it serves, stop it with SIGTERM:
    (exit code, output, "", the probes that got another status than theirs)."""
    import http.client
    import re

    process = subprocess.Popen([sys.executable, "-m", "rlhf", *args], cwd=work, env=env, text=True,
                               errors="replace", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    deadline, url, wrong = time.monotonic() + timeout, None, []
    while url is None and time.monotonic() < deadline and process.poll() is None:
        url = next(
            (m.group(1) for line in list(lines) if (m := re.search(r" on (http://\S+) \(", line))), None
        )
        time.sleep(0.1)
    token = next((line.rsplit(" ", 1)[-1].strip() for line in list(lines) if line.startswith("token (")), "")
    if url is None:
        wrong.append("the server never said where it serves")
    else:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        host = "127.0.0.1" if host in ("0.0.0.0", "[::]") else host.strip("[]")
        for i, probe in enumerate(probes):
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            headers = {
                "Content-Type": "application/json",
                **{k: v.replace("{token}", token) for k, v in probe.headers},
            }
            try:
                connection.request(probe.method, probe.path, body=probe.body, headers=headers)
                response = connection.getresponse()
                status, answer = response.status, response.read()[:200]
            except (OSError, http.client.HTTPException) as err:
                status, answer = None, repr(err).encode()
            finally:
                connection.close()
            if status != probe.status:
                wrong.append(
                    f"probe {i} ({probe.method} {probe.path}): HTTP {status} {answer!r}, not {probe.status}"
                )
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        code = None
    reader.join(timeout=10)
    return code, "".join(lines), "", wrong


def _with_address(args: list[str], port: int | None) -> list[str]:
    if port is None:
        return list(args)
    return [a.replace("{url}", f"http://127.0.0.1:{port}").replace("{port}", str(port)) for a in args]


def run_case(
    case: Case, inputs: Path, scratch: Path, timeout: float = 600, in_process: bool = False
) -> Outcome:
    """Run `case` in a fresh copy of `inputs` under `scratch`: a subprocess as a user runs it, or
    `in_process` (faster, for the test suite: no interpreter start; `env` cases need a process)."""
    reason = case.skip() if case.skip else None
    if in_process and (case.env or case.probes):
        reason = "needs its own process (environment variables, a server)"
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
    timeout = min(timeout, case.timeout)
    server = _start_server(case.server) if case.server else None
    port = server.server_address[1] if server else None
    args = _with_address(case.args, port)
    start = time.monotonic()
    try:
        if in_process:
            with _alarm(timeout):
                code, stdout, stderr = _in_process(args, work)
        elif case.probes:
            code, stdout, stderr, wrong = _probe_server(args, work, env, case.probes, timeout)
        else:
            try:
                run = subprocess.run([sys.executable, "-m", "rlhf", *args], cwd=work, env=env, capture_output=True,
                                     text=True, errors="replace", timeout=timeout)  # fmt: skip
                code, stdout, stderr = run.returncode, run.stdout, run.stderr
            except subprocess.TimeoutExpired as err:
                code, stdout, stderr = None, str(err.stdout or ""), f"timed out after {timeout} s"
    finally:
        if server:
            server.shutdown()
            server.server_close()
    outcome = Outcome(case, code=code, seconds=time.monotonic() - start)
    output = stdout + stderr
    outcome.missing = [w for w in _with_address(list(case.words), port) if w not in output]
    outcome.missing += [f"(absent) {w}" for w in case.absent if w in output]
    if case.probes:
        outcome.missing += wrong
    outcome.traceback = "Traceback (most recent call last)" in output
    after = snapshot(work)
    keep = before if case.unchanged == ALL else {
        k: v for k, v in before.items() if any(k == p or k.startswith(p + "/") for p in case.unchanged)
    }  # fmt: skip
    # a run directory's lock file holds the pid of its last holder: rlhf's own record, not the user's
    outcome.changed = [k for k, v in keep.items() if after.get(k) != v and Path(k).name != ".lock"]
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
    parser.add_argument("--group", help="comma-separated groups: " + ", ".join(GROUPS))
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run each case in this process (faster: no interpreter start; cases with env vars still skip)",
    )
    args = parser.parse_args(argv)
    cases = CASES
    if args.group:
        unknown = set(args.group.split(",")) - set(GROUPS)
        if unknown:
            parser.error(f"unknown groups: {sorted(unknown)}; the groups: {', '.join(GROUPS)}")
        cases = [c for g in args.group.split(",") for c in GROUPS[g]]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown cases: {sorted(unknown)}")
        cases = [c for c in cases if c.name in wanted]
    if args.list:
        for case in cases:
            print(f"{case.name}: rlhf {' '.join(case.args)} -> exit {case.code}")
        return 0
    with tempfile.TemporaryDirectory(prefix="rlhf-misuse-") as scratch:
        inputs = Path(scratch) / "inputs"
        build_inputs(inputs)
        outcomes = []
        for case in cases:
            outcomes.append(run_case(case, inputs, Path(scratch), in_process=args.in_process))
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
