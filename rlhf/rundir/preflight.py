"""Checks every command makes on its validated config before any model loads (`open_run` calls
them for a run directory's stages, rlhf/cli for eval and rm-eval), so that a mistake a
user can fix ends as one message (key, value, fix; exit 2) at the start, never after the work:
- optional packages the config asks for: the `wandb` and `tensorboard` sinks, `dist.runtime ray`,
  a GGUF model (`gguf_file`);
- input files that are not regular files (a FIFO, a device, a folder given as a data file), which a
  reader would wait on forever or fail in;
- `world:DIR` judges whose world.json cannot be read;
- a Ray address that does not answer (a bounded wait instead of Ray's endless retries);
- `train.packing` on a model whose architecture (read from its config.json) cannot pack.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
import stat

from rlhf.config import ConfigError

# what each optional feature imports, and the install line of its fix
OPTIONAL_PACKAGES = {
    "wandb": ("wandb", "pip install wandb"),
    "tensorboard": ("tensorboard", "pip install tensorboard (or pip install 'rlhf[tensorboard]')"),
    "ray": ("ray", "pip install 'ray[default]' (or pip install 'rlhf[ray]')"),
    "gguf": ("gguf", "pip install gguf"),
}
RAY_CONNECT_SECONDS = 5.0  # how long a Ray address may take to accept a connection


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing(feature: str, key: str, value, other_fix: str) -> ConfigError:
    module, install = OPTIONAL_PACKAGES[feature]
    return ConfigError(
        f"{key} {value!r} needs the {module} package, which is not installed. Fix: {install}, or {other_fix}.",
        key,
    )


def check_optional_packages(config) -> None:
    """Raise ConfigError when `config` asks for a feature whose package is not installed."""
    sinks_key = "log.sinks" if hasattr(config, "log") and hasattr(config.log, "sinks") else "sinks"
    sinks = config.log.sinks if sinks_key == "log.sinks" else getattr(config, "sinks", [])
    for sink in ("wandb", "tensorboard"):
        if sink in sinks and not installed(OPTIONAL_PACKAGES[sink][0]):
            kept = [s for s in sinks if s != sink]
            raise _missing(sink, sinks_key, list(sinks), f"--{sinks_key} '[{','.join(kept)}]'")
    dist = getattr(config, "dist", None)
    if getattr(dist, "runtime", "local") == "ray" and not installed("ray"):
        raise _missing("ray", "dist.runtime", "ray", "--dist.runtime local")
    model = getattr(config, "model", None)
    gguf = getattr(config, "gguf_file", None) or getattr(model, "gguf_file", None)
    if gguf and not installed("gguf"):
        key = "gguf_file" if getattr(config, "gguf_file", None) else "model.gguf_file"
        raise _missing("gguf", key, gguf, "convert the model with save_pretrained")


def check_input_file(path: str | None, flag: str) -> None:
    """`path`, when it exists, is a regular file (or a folder of data files, which the loader reads):
    a FIFO, socket or device would block or fail the reader."""
    if not path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the loader's own message names it
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    raise ConfigError(
        f"{flag} {path} is {kind}, not a data file: reading it could wait forever. Fix: save the data to a "
        f"file (e.g. cat {path} > data.jsonl) and pass that file instead."
    )


def check_world_judge(spec: str, flag: str = "--judge") -> None:
    """A `world:DIR` judge names a readable world (DIR/world.json, written by `rlhf demo`)."""
    if not spec or not str(spec).startswith("world:"):
        return
    from rlhf.worlds import WorldConfig, WorldConfigError

    where = str(spec)[len("world:") :]
    try:
        WorldConfig.load(where)
    except WorldConfigError as err:
        raise ConfigError(
            f"{flag} {spec}: no readable world there ({err}). Fix: pass world:DIR where DIR holds the "
            "world.json of a demo (e.g. world:runs/demo/world)."
        ) from None


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_SECONDS) -> None:
    """A HOST:PORT (or ray://HOST:PORT) Ray address accepts a TCP connection within `timeout` seconds;
    None (start Ray here) and "auto" (find the local cluster) are not probed."""
    if not address or address == "auto":
        return
    text = address.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"ray.address must be HOST:PORT, ray://HOST:PORT or auto, got {address!r}. Fix: --ray.address "
            "127.0.0.1:6379 (the address `ray start --head` printed), or leave it out to start Ray here.",
            "ray.address",
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(
            f"ray.address {address!r}: nothing answered within {timeout:g} s ({err.strerror or err}). Fix: "
            "start the cluster (`ray start --head`) and pass the address it prints, or leave --ray.address "
            "out to start Ray on this machine.",
            "ray.address",
        ) from None


def check_packing(config) -> None:
    """`train.packing` asks for sequence packing: each model directory's architecture (its
    config.json; a GGUF or hub model is checked when it loads) must take a document mask."""
    if not getattr(getattr(config, "train", None), "packing", False):
        return
    model = getattr(config, "model", None)
    keys = {"model": model} if isinstance(model, str) else {
        "model.policy": getattr(model, "policy", None), "model.reward_model": getattr(model, "reward_model", None)
    }  # fmt: skip
    for key, path in keys.items():
        if not path or not os.path.isfile(os.path.join(path, "config.json")):
            continue
        from transformers import AutoConfig

        from rlhf.models.packing import architecture_refusal

        try:
            why = architecture_refusal(AutoConfig.from_pretrained(path))
        except (OSError, ValueError):
            continue  # unreadable: the loader's own message names it
        if why is not None:
            raise ConfigError(
                f"train.packing is true, but {why} ({key} {path}): its attention cannot keep packed "
                "sequences apart. Fix: --train.packing false.",
                "train.packing",
            )


def preflight(config) -> None:
    """Every check above that applies to `config` (any stage's config)."""
    check_optional_packages(config)
    data = getattr(config, "data", None)
    for key, flag in (("path", "--data"), ("prompts", "--prompts"), ("ptx", "--data.ptx")):
        value = getattr(data, key, None)
        if isinstance(value, str):
            check_input_file(value, flag)
    for spec in [getattr(config, "judge", None), *(getattr(config, "extra_judges", None) or [])]:
        if isinstance(spec, str):
            check_world_judge(spec)
    check_llm_judge(config)
    dist = getattr(config, "dist", None)
    if getattr(dist, "runtime", "local") == "ray" and dataclasses.is_dataclass(getattr(config, "ray", None)):
        check_ray_address(config.ray.address)
    check_packing(config)


def check_llm_judge(config) -> None:
    """`rlhf train`'s reward weights against its sources (--reward-fn is added after the config's
    checks), and the LLM judge's template (eval: pairwise, train: pointwise) before any model loads."""
    from rlhf.config.judge_template import load_template
    from rlhf.config.reward_sources import check_reward_weights

    reward = getattr(config, "reward", None)
    if reward is not None and hasattr(reward, "weights"):
        check_reward_weights(config)
    for judge, mode in (
        (getattr(reward, "llm_judge", None), "pointwise"),
        (getattr(config, "llm_judge", None), "pairwise"),
    ):
        if judge is not None and judge.url:
            load_template(judge.template, mode)
