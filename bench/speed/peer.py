"""TRL's PPOTrainer (the peer baseline) in its own venv: find the peer scripts, set the venv up once,
build the command of one case.

The peer files live outside the repo in ../shared/bench/peer/ (README.md, setup.sh,
trl_ppo_bench.py); the venv is .venv-trl in the repo root (git-ignored), made by setup.sh.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.speed.workload import Workload

TRL_VERSION = "1.12.0"
CHECK = (
    "import os; os.environ['TRL_EXPERIMENTAL_SILENCE'] = '1'; import trl; "
    "from trl.experimental.ppo import PPOTrainer; print(trl.__version__)"
)


def peer_dir(repo: Path) -> Path | None:
    """../shared/bench/peer beside the repo, if its two scripts are there."""
    path = repo.parent / "shared" / "bench" / "peer"
    if (path / "setup.sh").is_file() and (path / "trl_ppo_bench.py").is_file():
        return path
    return None


def venv_ready(venv: Path) -> bool:
    """True when `venv` imports TRL's PPOTrainer at the pinned version."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return False
    done = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=300)
    return done.returncode == 0 and done.stdout.strip().endswith(TRL_VERSION)


def ensure_venv(repo: Path, log_path: Path) -> tuple[Path | None, str]:
    """(python of .venv-trl, "") when usable, setting it up with the peer's setup.sh if needed;
    (None, reason) otherwise."""
    peer = peer_dir(repo)
    if peer is None:
        return None, f"{repo.parent / 'shared' / 'bench' / 'peer'} is absent (no peer scripts)"
    venv = repo / ".venv-trl"
    if venv_ready(venv):
        return venv / "bin" / "python", ""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"  setting up {venv} with {peer / 'setup.sh'} (about 2 minutes; log: {log_path})", flush=True)
    with open(log_path, "w") as log:
        done = subprocess.run(
            ["bash", str(peer / "setup.sh"), str(venv)],
            cwd=repo,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
    if done.returncode != 0 or not venv_ready(venv):
        return None, f"setup.sh failed (exit {done.returncode}); see {log_path}"
    return venv / "bin" / "python", ""


def trl_command(
    python: Path, repo: Path, workload: Workload, iters: int, warmup: int, threads: int
) -> list[str]:
    """The peer script on `workload`, `iters` PPO iterations, the first `warmup` not counted."""
    script = peer_dir(repo) / "trl_ppo_bench.py"
    return [
        str(python),
        str(script),
        "--size",
        workload.size,
        "--batch-size",
        str(workload.batch_size),
        "--response-length",
        str(workload.response_length),
        "--iters",
        str(iters),
        "--warmup",
        str(warmup),
        "--ppo-epochs",
        str(workload.ppo_epochs),
        "--mini-batches",
        str(workload.minibatches),
        "--threads",
        str(threads),
    ]


# What in the peer files keeps TRL off a GPU (file, text that does it, what it does).
CPU_PINS = (
    ("trl_ppo_bench.py", 'os.environ["CUDA_VISIBLE_DEVICES"] = ""', "hides every CUDA device"),
    ("trl_ppo_bench.py", "use_cpu=True", "passes use_cpu=True to PPOConfig"),
    ("trl_ppo_bench.py", "bf16=False", "fixes bf16=False (float32 only)"),
    ("setup.sh", '"+cpu" in torch.__version__', "installs and asserts the CPU build of torch"),
)


def gpu_blockers(repo: Path) -> list[str]:
    """What keeps the peer script from running TRL on a GPU as it is (empty: nothing found)."""
    peer = peer_dir(repo)
    if peer is None:
        return [f"{repo.parent / 'shared' / 'bench' / 'peer'} is absent (no peer scripts)"]
    found = [f"{name} {effect}" for name, text, effect in CPU_PINS if text in (peer / name).read_text()]
    if "--device" not in (peer / "trl_ppo_bench.py").read_text():
        found.append("trl_ppo_bench.py has no --device option")
    return found
