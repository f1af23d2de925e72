"""The measured figures of a SmolLM2 + HH run (run.sh) as one small JSON: both judges' held-out
accuracy with its Wilson interval and their length bias ("shorter wins"), every stage's share of
truncated prompts, DPO's final metrics, PPO reward/KL/ratio at the first and last iteration, the win
rates PPO vs SFT, DPO vs SFT and PPO vs DPO under each judge (raw, length-controlled and
length-matched, with intervals) and by held-out human labels (eval.json's "pairs"), wall time and peak RSS per stage, and side-by-side samples (the
prompt as the models saw it); `ppo_curves.png` beside it (the PPO run's reward and KL per iteration).

    python examples/smollm2_hh/summarize.py runs/smollm2_hh [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path


def t975(df: float) -> float:
    """Student's t 0.975 quantile (Cornish-Fisher, two terms: within 0.025 of the table for df >= 5,
    so that this script needs the standard library only."""
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


PPO_KEYS = (
    "reward/raw_mean",
    "kl/ref",
    "policy/ratio_min",
    "policy/ratio_max",
    "policy/clip_fraction",
    "policy/approx_kl",
    "policy_ppl",
    "response/length_mean",
    "response/eos_rate",
    "value/explained_variance",
)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_cost(time_file: Path) -> dict | None:
    """Wall time (s), CPU time (s, user + system) and peak RSS (MiB) from a GNU `time -v` file."""
    if not time_file.is_file():
        return None
    text = time_file.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", text)
    user = re.search(r"User time \(seconds\): ([\d.]+)", text)
    system = re.search(r"System time \(seconds\): ([\d.]+)", text)
    seconds = 0.0
    if wall:
        for part in wall.group(1).split(":"):
            seconds = seconds * 60 + float(part)
    return {
        "wall_s": round(seconds, 1),
        "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
        "cpu_percent": int(cpu.group(1)) if cpu else None,  # < 100 per thread: the machine was shared
        "cpu_s": round(float(user.group(1)) + float(system.group(1)), 1) if user and system else None,
    }


def reward_trend(records: list[dict]) -> dict:
    """Mean sampled reward of the last third of the iterations minus the first third's, with a
    95% Welch interval over the iterations' means: a rise the batch noise cannot explain, or not."""
    third = max(2, len(records) // 3)
    first = [r["reward/raw_mean"] for r in records[:third]]
    last = [r["reward/raw_mean"] for r in records[-third:]]
    va, vb = statistics.variance(first) / len(first), statistics.variance(last) / len(last)
    df = (va + vb) ** 2 / (va**2 / (len(first) - 1) + vb**2 / (len(last) - 1))
    diff, half = statistics.fmean(last) - statistics.fmean(first), t975(df) * math.sqrt(va + vb)
    return {
        "iterations_per_third": third,
        "first_third_mean": statistics.fmean(first),
        "last_third_mean": statistics.fmean(last),
        "difference": diff,
        "difference_ci95": [diff - half, diff + half],
    }


def plot_curves(records: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    its = [r["iteration"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, key, title in zip(
        axes,
        ("reward/raw_mean", "kl/ref", "response/length_mean"),
        (
            "reward-model score of the samples",
            "KL to the reference (nats / response)",
            "response length (tokens)",
        ),
    ):
        ax.plot(its, [r.get(key) for r in records], marker="o", markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def final_metrics(run: Path) -> dict:
    """The last record of a supervised run's metrics.jsonl with data/ figures (the final metrics)."""
    path = run / "metrics.jsonl"
    records = jsonl(path) if path.is_file() else []
    return next((r for r in reversed(records) if "data/prompts" in r), records[-1] if records else {})


def truncated(figures: dict | None, prefix: str = "") -> dict | None:
    """Prompts that lost turns or tokens to the budget: count, of, share."""
    if not figures or figures.get(f"{prefix}prompts") is None:
        return None
    return {
        "prompts": figures[f"{prefix}prompts"],
        "truncated": figures.get(f"{prefix}prompts_truncated"),
        "share": figures.get(f"{prefix}prompts_truncated_share"),
    }


def logged_truncation(log: Path) -> dict | None:
    """The data/ rows of a stage's summary table in its log (a run whose metrics.jsonl lacks them)."""
    if not log.is_file():
        return None
    text = log.read_text(errors="replace")
    rows = dict(re.findall(r"(data/prompts(?:_truncated(?:_share)?)?)\s*│\s*([\d.]+)", text))
    if "data/prompts" not in rows:
        return None
    return truncated({k: float(v) if "." in v else int(v) for k, v in rows.items()}, "data/")


def judge_figures(rm_eval: dict) -> dict:
    """A reward model's held-out accuracy with its Wilson interval, and its length bias."""
    length = rm_eval.get("length") or {}
    shorter = length.get("shorter_wins") or {}
    return {
        **{k: rm_eval.get(k) for k in ("n", "accuracy", "accuracy_ci95", "ties")},
        "margin_mean": (rm_eval.get("margin") or {}).get("mean"),
        "shorter_wins_accuracy": shorter.get("accuracy"),
        "shorter_wins_ci95": shorter.get("accuracy_ci95"),
        "margin_length_correlation": length.get("margin_correlation"),
        "prompts_truncated": truncated(rm_eval.get("truncation")),
    }


def label_verdict(pairs: dict | None) -> dict | None:
    """eval.json's "pairs" (docs/algorithms.md §38) without its per-pair rows."""
    if not pairs:
        return None
    keys = (
        "n", "accuracy", "ci95", "wins", "ties", "losses", "margin_mean", "margin_ci95", "margin_median",
        "chosen_logratio_mean", "rejected_logratio_mean", "per_token_accuracy", "per_token_ci95",
        "skipped_invalid", "max_prompt_tokens", "max_response_tokens",
    )  # fmt: skip
    return {k: pairs.get(k) for k in keys}


def relative(path, root: Path | None) -> str | None:
    """`path` relative to the run directory `root` (results name no machine's directories); a path
    outside it by its name; no `root`: as it is."""
    if path is None or root is None:
        return path
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return Path(path).name


def win_rates(evaluation: dict, root: Path | None = None) -> dict:
    """Every judge's win rate of the policy over the baseline: raw (ties half), length-controlled
    and length-matched, each with its interval; mean words of both sides."""
    samples = evaluation.get("samples", [])
    words = {}
    for side in ("policy", "baseline"):  # words per response: a shorter policy is a judge's preference
        counts = [len(x[f"{side}_response"].split()) for x in samples if f"{side}_response" in x]
        words[f"{side}_words_mean"] = statistics.fmean(counts) if counts else None
    judges = evaluation.get("judges")
    if judges is None:  # an eval.json of one judge, from before "judges"
        judges = {evaluation.get("judge", "judge"): evaluation}
    by_judge = {}
    for name, figures in judges.items():
        name = relative(name, root)
        cmp, length = figures["comparison"], figures.get("length") or {}
        lc, matched = length.get("length_controlled") or {}, length.get("length_matched") or {}
        by_judge[name] = {
            "n": cmp.get("n"),
            "win_rate": cmp.get("win_rate"),
            "win_rate_ci95": cmp.get("win_rate_ci95"),
            "win_tie_loss": [cmp.get("win"), cmp.get("tie"), cmp.get("loss")],
            "policy_reward": figures["policy"].get("mean"),
            "baseline_reward": figures["baseline"].get("mean"),
            "length_controlled_win_rate": lc.get("win_rate"),
            "length_controlled_ci95": lc.get("win_rate_ci95"),
            "length_coef": lc.get("length_coef"),
            "length_matched_win_rate": matched.get("win_rate"),
            "length_matched_ci95": matched.get("win_rate_ci95"),
            "length_matched_n": matched.get("n"),
            "length_warning": length.get("warning"),
        }
    return {
        "policy": relative(evaluation["policy"].get("path"), root),
        "baseline": relative(evaluation["baseline"].get("path"), root),
        **words,
        "prompts_truncated": truncated(evaluation.get("truncation")),
        "judges": by_judge,
        "held_out_labels": label_verdict(evaluation.get("pairs")),
        "kl_to_baseline": evaluation.get("kl"),  # on the policy's answers, nats an answer (algorithms.md §38)
    }


def summarize(out: Path) -> dict:
    """Every figure of the run that exists (a stage not run yet is left out)."""
    result: dict = {"split": json.loads((out / "data" / "split.json").read_text())}
    result["split"]["data"] = Path(result["split"]["data"]).name  # no machine's directories
    for name in ("rm", "rm2"):
        rm_eval = read_json(out / name / "rm_eval.json")
        if rm_eval:
            result[f"{name}_heldout"] = judge_figures(rm_eval)
    result["prompts_truncated"] = {
        name: truncated(final_metrics(out / name), "data/") or logged_truncation(out / "logs" / f"{name}.log")
        for name in ("sft", "rm", "rm2", "dpo", "ppo")
    }
    dpo = final_metrics(out / "dpo")
    if dpo:
        result["dpo"] = {k: v for k, v in dpo.items() if k.startswith(("train/", "eval/")) or k == "step"}
    path = out / "ppo" / "metrics.jsonl"
    records = [r for r in jsonl(path) if "iteration" in r and "event" not in r] if path.is_file() else []
    if records:
        result["ppo"] = {
            "iterations": len(records),
            "first": {k: records[0].get(k) for k in PPO_KEYS},
            "last": {k: records[-1].get(k) for k in PPO_KEYS},
            "reward_trend": reward_trend(records) if len(records) >= 4 else None,
            "curve": [
                {k: r.get(k) for k in ("iteration", "reward/raw_mean", "kl/ref", "policy/clip_fraction")}
                for r in records
            ],
        }
        if plot_curves(records, out / "ppo_curves.png"):
            result["ppo"]["curves_png"] = "ppo_curves.png"
    comparisons = {
        "ppo_vs_sft": out / "ppo" / "eval.json",
        "dpo_vs_sft": out / "dpo" / "eval.json",
        "ppo_vs_dpo": out / "ppo" / "eval_vs_dpo.json",
    }
    result["win_rates"] = {}
    for name, path in comparisons.items():
        evaluation = read_json(path)
        if evaluation:
            result["win_rates"][name] = win_rates(evaluation, out)
            result.setdefault("samples", {})[name] = [
                {
                    k: x.get(k)
                    for k in (
                        "prompt_seen",
                        "policy_response",
                        "baseline_response",
                        "policy_score",
                        "baseline_score",
                    )
                }
                for x in evaluation.get("samples", [])[:3]
            ]
    result["stages"] = {p.stem: stage_cost(p) for p in sorted((out / "logs").glob("*.time"))}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the OUT directory of run.sh")
    parser.add_argument("--out", help="write the JSON here (default: RUN/results.json)")
    args = parser.parse_args()
    result = summarize(Path(args.run))
    path = Path(args.out or Path(args.run) / "results.json")
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "split")}, indent=2))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
