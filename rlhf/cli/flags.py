"""The flag tables every command is declared with, and the value types of their flags.

A command's table is a tuple of `flag(...)` entries, in the order `--help` lists them; an entry with
a `key` is a named flag that sets that dotted config key (`--policy` sets `model.policy`), under the
dotted overrides of the same command line (`overrides`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # "--policy" (and its aliases, or a positional's name)
    key: str | None = None  # the dotted config key it sets (None: the command reads it itself)
    options: dict[str, Any] = field(default_factory=dict)  # argparse's add_argument keywords

    @property
    def dest(self) -> str:
        return self.options.get("dest") or self.names[0].lstrip("-").replace("-", "_")


def flag(*names: str, key: str | None = None, **options: Any) -> Flag:
    return Flag(names, key, options)


def add_flags(parser: argparse.ArgumentParser, table: tuple[Flag, ...]) -> argparse.ArgumentParser:
    for entry in table:
        parser.add_argument(*entry.names, **entry.options)
    return parser


def named_values(args: argparse.Namespace, table: tuple[Flag, ...]) -> dict[str, Any]:
    """{dotted key: value} of the table's named flags (None: not given)."""
    return {entry.key: getattr(args, entry.dest) for entry in table if entry.key}


def flag_names(table: tuple[Flag, ...]) -> dict[str, str]:
    """{dotted key: "--flag-name"} of the table's named flags (for the message when both are given)."""
    return {entry.key: entry.names[0] for entry in table if entry.key}


def config_overrides(args: argparse.Namespace, rest: list[str], table: tuple[Flag, ...]) -> dict:
    """The dotted overrides of `rest` with the values of the table's named flags under them."""
    return overrides(rest, named_values(args, table), flag_names(table))


def overrides(rest: list[str], named: dict[str, Any], flags: dict[str, str] | None = None) -> dict:
    """The dotted overrides of `rest` with the named flags' values (`named`: dotted key -> value) under
    them. A named flag and its dotted key given with two values is one setting said twice: refused,
    naming both (`flags`: dotted key -> the named flag's spelling, for the message)."""
    from rlhf.config import ConfigError, deep_merge, parse_overrides

    merged = parse_overrides(rest)
    for dotted, value in named.items():
        if value is None:
            continue
        node = merged
        for part in dotted.split("."):
            node = node.get(part, _UNSET) if isinstance(node, dict) else _UNSET
        if node is not _UNSET and node != value and not isinstance(node, dict):
            spelled = (flags or {}).get(dotted) or "--" + dotted.split(".")[-1].replace("_", "-")
            raise ConfigError(
                f"command line: {spelled} {value!r} and --{dotted} {node!r} are one setting ({spelled} sets "
                f"{dotted}) given two values. Fix: give only one of them."
            )
        node = {}
        top = node
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        merged = deep_merge(top, merged)  # explicit dotted flags win over named ones
    return merged


_UNSET = object()


def refuse_extra(rest: list[str], command: str) -> None:
    """A command that takes no dotted overrides: anything argparse left is a mistake."""
    if rest:
        raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf {command} --help`.")


# -- value types ---------------------------------------------------------------------------------------
def scalar(raw: str):
    """A named flag's value read as a dotted override's is (YAML scalar: 4, 0.5, true, null)."""
    from rlhf.config import parse_overrides

    return parse_overrides(["--value", raw])["value"]


def positive_int(raw: str) -> int:
    """A whole number >= 1 (a count of seeds, jobs, GPUs)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {raw!r}. Fix: e.g. 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}. Fix: e.g. 1")
    return value


def memory_size(raw: str) -> str:
    """--gpu-memory: a size with its unit (80GB, 24GiB, 512MB); a bare number is refused, since 80
    could be GB or bytes."""
    text = str(raw).strip().lower().replace(" ", "")
    number = re.fullmatch(r"(\d+(\.\d+)?)(gib|gb|g|mib|mb|m)?", text)
    if number is None:
        raise argparse.ArgumentTypeError(
            f"must be a size like 80GB or 24GiB, got {raw!r}. Fix: --gpu-memory 80GB"
        )
    if number.group(3) is None:
        raise argparse.ArgumentTypeError(
            f"{raw!r} has no unit (GB? bytes?). Fix: --gpu-memory {number.group(1)}GB (or MiB, GiB)"
        )
    if float(number.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {raw!r}. Fix: --gpu-memory 80GB")
    return raw


# -- flags several commands share --------------------------------------------------------------------
def safety_flags() -> tuple[Flag, ...]:
    """Model directories are data: their code never runs, their pickle weights are never read, unless
    these flags say so (rlhf/models/trust.py)."""
    from rlhf.models.trust import PICKLE_FLAG, TRUST_FLAG

    return (
        flag(
            TRUST_FLAG,
            action="store_true",
            help="let transformers run the Python files of a model directory (auto_map); off: refused",
        ),
        flag(
            PICKLE_FLAG,
            action="store_true",
            help="read pickle weights (pytorch_model.bin) when a directory has no safetensors; off: refused",
        ),
    )


SKIP_INVALID = flag(
    "--skip-invalid",
    key="data.skip_invalid",
    action="store_true",
    default=None,
    help="skip malformed data records (counted and reported) instead of stopping at the first "
    "(same as --data.skip_invalid true)",
)
ALLOW_CHANGED_MODELS = flag(
    "--resume-allow-changed-models",
    action="store_true",
    help="with --resume: continue although a model file the run reads (policy/reference, reward model) "
    "changed since the run started (refused otherwise; the change is recorded in run_inputs.json)",
)
DEVICE_FLAGS = (  # the `device` and `dtype` keys of eval's and rm-eval's configs
    flag("--device", key="device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N"),
    flag(
        "--dtype",
        key="dtype",
        type=scalar,
        help="auto (bfloat16 on a GPU, float32 on a CPU) | float32 | bfloat16 (autocast) | bfloat16-pure",
    ),
)


def llm_judge_flags(asked: str, group: str) -> tuple[Flag, ...]:
    """--judge-url/-model/-key-env/-template of train and eval, setting `group`'s keys
    (rlhf/config/llm_judge.py; docs/usage.md#llm-judge)."""
    return (
        flag(
            "--judge-url",
            key=f"{group}.url",
            metavar="URL",
            help=f"an LLM judge: an OpenAI-compatible server's base URL (http://HOST:PORT/v1) asked for {asked} "
            f"({group}.url; docs/usage.md#llm-judge)",
        ),
        flag(
            "--judge-model",
            key=f"{group}.model",
            metavar="NAME",
            help=f"the judge server's model ({group}.model)",
        ),
        flag(
            "--judge-key-env",
            key=f"{group}.key_env",
            metavar="NAME",
            help=f"the environment variable holding the judge server's API key ({group}.key_env; the name is "
            "recorded, never the key)",
        ),
        flag(
            "--judge-template",
            key=f"{group}.template",
            metavar="FILE",
            help=f"the judge's prompt template; default built in ({group}.template)",
        ),
    )
