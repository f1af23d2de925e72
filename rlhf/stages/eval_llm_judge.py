"""`rlhf eval --judge-url URL`: an LLM judge's pairwise verdicts on the policy's and the baseline's
answers, each pair asked twice with the positions swapped (rlhf/evaluation/pairwise_verdicts.py);
eval.json's "llm_judge", each sample's `llm_judge_verdict`, a summary block."""

from __future__ import annotations

from pathlib import Path

from rlhf.config import EvalConfig
from rlhf.evaluation.pairwise_verdicts import swapped_win_rate
from rlhf.monitor import print_summary
from rlhf.monitor.progress import WorkProgress
from rlhf.rl.llm_judge import LLMJudge

BATCH = 32  # pairs per round of requests (the unparsable share is checked per round)


def llm_judge(config: EvalConfig) -> LLMJudge | None:
    """The judge client (its API key read and its server probed now, before any model loads,
    `LLMJudge.check_server`), or None without --judge-url."""
    if not config.llm_judge.url:
        return None
    judge = LLMJudge(config.llm_judge, "pairwise", key="llm_judge")
    judge.check_server()
    return judge


def judge_pairs(judge: LLMJudge, prompts: list[str], policy: list[str], baseline: list[str]) -> dict:
    """eval.json's "llm_judge": `swapped_win_rate` of the verdicts, the replies left unparsed, the
    judge's settings (never its key), and each pair's two verdicts under "verdicts"."""
    first: list = []
    swapped: list = []
    with WorkProgress("eval: LLM judge, both orders", len(prompts), "pair") as progress:
        for start in range(0, len(prompts), BATCH):
            end = min(start + BATCH, len(prompts))
            where = f"LLM judge, prompts {start + 1}-{end}: "
            p, a, b = prompts[start:end], policy[start:end], baseline[start:end]
            first += judge.verdicts(p, a, b, where=where)  # the policy's answer shown as A
            swapped += judge.verdicts(p, b, a, where=where)  # ... and as B
            progress.advance(end - start)
    figures = swapped_win_rate(first, swapped)
    outcomes = figures.pop("outcomes")
    settings = config_record(judge)
    return {
        **figures,
        "win": figures["wins"] / figures["n"] if figures["n"] else None,
        "tie": figures["ties"] / figures["n"] if figures["n"] else None,
        "loss": figures["losses"] / figures["n"] if figures["n"] else None,
        "unparsable": judge.unparsable,
        "replies": judge.replies,
        **settings,
        "verdicts": [
            {"policy_as_a": x, "policy_as_b": y, "outcome": o} for x, y, o in zip(first, swapped, outcomes)
        ],
    }


def config_record(judge: LLMJudge) -> dict:
    """What eval.json records of the judge: its URL, model and template (the key's variable name only)."""
    s = judge.settings
    return {
        "url": s.url,
        "model": s.model,
        "template": s.template or "built-in",
        "key_env": s.key_env or None,
        "temperature": s.temperature,
    }


def print_llm_judge_summary(config: EvalConfig, result: dict, out: Path) -> None:
    """The one-screen summary of eval.json's "llm_judge"."""
    rate, ci = result["win_rate"], result["win_rate_ci95"]
    first = result["prefers_first"]
    print_summary(
        f"eval: {config.policy} vs {config.baseline} (LLM judge {result['model']}, n={result['n']})",
        {
            "win rate (ties half)": "-"
            if rate is None
            else f"{rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] (Wilson 95%)",
            "wins / ties / losses": f"{result['wins']} / {result['ties']} / {result['losses']}",
            "contradicted on swapping (ties)": str(result["inconsistent"]),
            "chose response A": "-" if first is None else f"{first:.3f} of its decisive verdicts",
            "unparsable replies": f"{result['unparsable']} of {result['replies']} ({result['dropped']} pairs dropped)",
            "written": str(out),
        },
    )
