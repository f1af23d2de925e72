"""The package's layers: a module never imports one of a higher layer (docs/internals.md#package-layout).
Lazy imports inside functions count too: they are still a dependency."""

from __future__ import annotations

from pathlib import Path

import rlhf
from tests.core.test_core_layering import rlhf_imports

# lowest first; a module may import its own layer and those before it
LAYERS = (
    "core",
    "config",
    "planner",  # `rlhf plan`'s memory model over shapes, and its job from a preset's roles (config)
    "models",
    "data",  # data/check.py (`rlhf data check`) reads a model directory's tokenizer
    "worlds",
    "monitor",
    "parallel",  # the data-parallel library: peers, DDP, FSDP2, threads (trainers and runtimes share it)
    "runtime",
    "rundir",
    "train",
    "evaluation",
    "envs",  # environments and multi-turn episodes over the sampler (`--env module:Class`)
    "agents",  # the user's agents behind an OpenAI-compatible server over the sampler (`--agent`)
    "rl",
    "ray_runtime",
    "stages",
    "demo",
    "cli",  # rlhf/cli/ (the `rlhf` command), __main__.py, __init__.py
)
PACKAGE = Path(rlhf.__file__).parent


def layer_of(module: str) -> int:
    """The layer index of a dotted module name under rlhf."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return LAYERS.index("cli")  # top-level modules


def imports_of(source: Path) -> list[str]:
    """The rlhf modules `source` imports (`from rlhf import __version__` names no layer)."""
    return [name for name in rlhf_imports(source) if name != "rlhf"]


def module_name(source: Path) -> str:
    parts = source.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_folder_of_the_package_is_a_known_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders <= set(LAYERS), folders - set(LAYERS)


def test_no_module_imports_a_higher_layer():
    offenders = []
    for source in sorted(PACKAGE.rglob("*.py")):
        mine = layer_of(module_name(source))
        for name in imports_of(source):
            if layer_of(name) > mine:
                offenders.append(f"{source.relative_to(PACKAGE.parent)} imports {name}")
    assert offenders == [], "\n".join(offenders)


def test_the_check_sees_an_upward_import(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text("def f():\n    from rlhf.stages.sft import run_sft\n")
    assert imports_of(source) == ["rlhf.stages.sft"]
    assert layer_of("rlhf.stages.sft") > layer_of("rlhf.rl.trainer") > layer_of("rlhf.core.kl")
