"""Policy entropy per iteration with and without Clip-Cov / KL-Cov (docs/algorithms.md §43) on the
arithmetic task (rlhf/worlds/arithmetic.py; examples/arithmetic/run.py: a tiny Llama, the verifier
as the only reward, GRPO without its KL term).

    nice -n 10 .venv/bin/python bench/studies/entropy_cov.py [--out runs/entropy_cov] [--iterations 30]

The task and the SFT warm-up are built once; then `grpo`, `grpo` + clip_cov and `grpo` + kl_cov run
from the same SFT model and seed. The paper's share of selected tokens (2e-4) picks one token of
the ~1,000 of an iteration here, so the runs use --cov-ratio (default 0.02). Writes
bench/results/entropy_cov.json (entropy and reward per iteration, held-out accuracy after) and
bench/results/entropy_cov.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def load_example():
    spec = importlib.util.spec_from_file_location(
        "arithmetic_example", ROOT / "examples" / "arithmetic" / "run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants(ratio: float) -> dict[str, list[str]]:
    """The runs: their extra `rlhf train` flags over the example's grpo."""
    return {
        "grpo": [],
        "grpo + clip_cov": ["--policy.cov_control", "clip_cov", "--policy.cov_ratio", str(ratio)],
        "grpo + kl_cov": ["--policy.cov_control", "kl_cov", "--policy.cov_ratio", str(ratio)],
    }


def curves(run_dir: Path) -> dict[str, list[float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "iteration" in r and "event" not in r and "policy/entropy" in r]
    return {
        "entropy": [r["policy/entropy"] for r in rows],
        "reward": [r.get("reward/raw_scores", float("nan")) for r in rows],
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, run in results["runs"].items():
        ax.plot(run["entropy"], label=f"{name} (held-out acc {run['after']['accuracy']:.0%})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("policy entropy (nats / token)")
    ax.set_title(f"arithmetic task, cov_ratio {results['cov_ratio']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/entropy_cov")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--cov-ratio", type=float, default=0.02)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    example = load_example()
    out = Path(args.out)
    results: dict = {"iterations": args.iterations, "sft_steps": args.sft_steps, "cov_ratio": args.cov_ratio,
                     "runs": {}}  # fmt: skip
    for name, flags in variants(args.cov_ratio).items():
        # one task and SFT model (written by the first run), each RL run read before the next replaces it
        common = ["--out", str(out), "--algorithm", "grpo", "--iterations", str(args.iterations)]
        result = example.main([*common, "--sft-steps", str(args.sft_steps), *flags])
        run = curves(out / "rl-grpo-seed0")
        results["runs"][name] = {**run, "before": result["before"], "after": result["after"], "flags": flags}
    target = Path(args.results)
    target.mkdir(parents=True, exist_ok=True)
    (target / "entropy_cov.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, target / "entropy_cov.png")
    for name, run in results["runs"].items():
        print(f"{name:16s} entropy {run['entropy'][0]:.3f} -> {run['entropy'][-1]:.3f}, "
              f"held-out accuracy {run['after']['accuracy']:.1%}")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
