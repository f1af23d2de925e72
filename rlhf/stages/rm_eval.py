"""`rlhf rm-eval`: judge a reward model on a file of preference pairs.

    rlhf rm-eval --reward-model runs/rm --data pairs.jsonl [--out rm_eval.json] [--skip-invalid]

Settings: `RMEvalConfig` (rlhf/config/rm_eval.py). Pairs are encoded as `rlhf rm` does (with the
reward model's own prompt and response budgets unless overridden) and scored in the training layout.
The JSON holds the statistics of `pair_stats`, the reward model's length bias
(`length_control.reward_model_length_bias`), the worst pairs with their texts and every pair's two
scores."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from rlhf.config import ConfigError, RewardConfig, RewardDataConfig, RMEvalConfig, from_dict, load_config
from rlhf.data.collate import collate_pairs
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats
from rlhf.evaluation.length_control import reward_model_length_bias
from rlhf.evaluation.pair_stats import sigmoid, summarize_margins, worst_indices
from rlhf.models.backbone import model_context
from rlhf.models.device import resolve_device, to_device
from rlhf.models.loading import load_tokenizer
from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.monitor import print_summary
from rlhf.monitor.progress import WorkProgress, announce
from rlhf.monitor.run_files import recorded_data_settings
from rlhf.stages.result_files import refuse_foreign_file, refuse_replacing_other_result, write_result
from rlhf.stages.rm import EncodedPair, encode_pairs
from rlhf.train.guards import require_finite_scores

RESULT_NAME = "rm_eval.json"
RESULT_KEYS = ("reward_model", "data", "pairs_read")  # what makes a JSON file an earlier rm_eval.json
# taken from the RM's config.yaml: the pairs are encoded as it was trained on them
BUDGET_KEYS = ("format", "max_prompt_tokens", "max_response_tokens", "chat_template", "system_prompt")


def rm_eval_config(*, file: str | None = None, overrides: dict | None = None) -> RMEvalConfig:
    """The validated `rlhf rm-eval` config: stage defaults < the reward model's training budgets
    (`BUDGET_KEYS` of its config.yaml, when it has one) < `--config FILE` < flags."""
    config = load_config(RMEvalConfig, file=file, overrides=overrides)
    recorded = {k: v for k, v in recorded_data_settings(config.reward_model).items() if k in BUDGET_KEYS}
    if not recorded:
        return config
    from_dict(RMEvalConfig, {"data": recorded}, origin=f"{Path(config.reward_model) / 'config.yaml'}")
    return load_config(RMEvalConfig, file=file, overrides=overrides, defaults={"data": recorded})


@torch.inference_mode()
def score_pairs(
    model: ScalarHeadModel,
    rows: list[EncodedPair],
    pad_id: int,
    batch_size: int,
    *,
    precision: Precision | None = None,
    progress: WorkProgress | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the chosen and rejected responses ([n] float64 each, in `rows` order). Pairs of
    similar length are batched together (less padding; a reward does not depend on its padding)."""
    model.eval()
    device = next(model.parameters()).device
    chosen = torch.zeros(len(rows), dtype=torch.float64)
    rejected = torch.zeros(len(rows), dtype=torch.float64)
    order = sorted(range(len(rows)), key=lambda i: rows[i].num_tokens)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        batch = [rows[i] for i in index]
        padded = collate_pairs(
            [r.prompt_ids for r in batch],
            [r.chosen_ids for r in batch],
            [r.rejected_ids for r in batch],
            pad_id,
        )
        padded = to_device(padded, device)
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            scores = model.score(padded["input_ids"], padded["attention_mask"]).double().cpu()
        chosen[index], rejected[index] = scores[: len(batch)], scores[len(batch) :]  # chosen rows first
        if progress is not None:
            progress.advance(len(batch))
    return chosen, rejected


def run_rm_eval(config: RMEvalConfig, *, model: ScalarHeadModel | None = None, tokenizer=None) -> dict:
    """Load, score, summarize, write `rm_eval.json` and print the one-screen summary; returns the result.

    `config` is validated (`rm_eval_config`); a given `model` / `tokenizer` is used instead of
    loading `config.reward_model` (which still names it)."""
    out = Path(config.out) if config.out else Path(config.reward_model) / RESULT_NAME
    refuse_foreign_file(  # before any work
        out, RESULT_KEYS, "rlhf rm-eval", RESULT_NAME, "" if config.out else "in the --reward-model folder"
    )
    if not config.out:  # the default file: never a result of another data file (--out names one)
        stem = Path(str(config.data.path)).name.split(".")[0] or "data"
        refuse_replacing_other_result(
            out,
            {"data": str(config.data.path)},
            lambda earlier: {"data": earlier.get("data")},
            "rlhf rm-eval",
            out.with_name(f"rm_eval_{stem}.json"),
        )
    device = resolve_device(config.device, key="device")
    precision = Precision.resolve(config.dtype, device, key="dtype")
    data = config.data
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.reward_model)
    loaded = load_examples(data.path, kind="preference", format=data.format, skip_invalid=data.skip_invalid)
    examples = loaded.examples[: config.n] if config.n else loaded.examples
    stats = TruncationStats()
    rows = encode_pairs(tokenizer, examples, RewardConfig(data=data), stats)
    if model is None:
        with announce(f"loading the reward model {config.reward_model}"):
            model = ScalarHeadModel.from_pretrained(config.reward_model, dtype=precision.param_dtype)
    precision.prepare(model)
    _check_pairs_fit(rows, examples, model, data)
    with WorkProgress("rm-eval: scoring", len(rows), "pair") as progress:
        chosen, rejected = score_pairs(
            model, rows, tokenizer.pad_token_id, config.batch_size, precision=precision, progress=progress
        )
    margins = chosen - rejected
    _check_finite(margins, examples, config.reward_model)
    result = {
        "reward_model": str(config.reward_model),
        "data": str(data.path),
        "pairs_read": len(loaded.examples),
        "skipped_invalid": loaded.skipped,
        "skipped_reasons": [str(error) for error in loaded.errors[:20]],
        "truncation": stats.as_dict(),
        **summarize_margins(
            margins, histogram_bins=config.histogram_bins, calibration_bins=config.calibration_bins
        ),
        "length": reward_model_length_bias(
            margins.tolist(), [len(r.chosen_ids) for r in rows], [len(r.rejected_ids) for r in rows]
        ),
        "worst_pairs": [
            _pair_record(examples[i], float(chosen[i]), float(rejected[i]))
            for i in worst_indices(margins, config.worst)
        ],
        "pairs": [
            {"source": _source(ex), "chosen_score": float(c), "rejected_score": float(r)}
            for ex, c, r in zip(examples, chosen, rejected)
        ],
    }
    write_result(out, result)
    print_rm_eval_summary(result, out)
    return result


def _check_pairs_fit(rows: list[EncodedPair], examples, model, data: RewardDataConfig) -> None:
    context = model_context(model)
    if context is None:
        return
    lengths = [len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)) for r in rows]
    too_long = [i for i, n in enumerate(lengths) if n > context]
    if too_long:
        first = too_long[0]
        raise ConfigError(
            f"{_source(examples[first])}: the pair needs {lengths[first]} positions and the reward model has "
            f"{context} ({len(too_long)} of {len(rows)} pairs do not fit). Fix: lower --data.max_prompt_tokens "
            f"or --data.max_response_tokens (now {data.max_prompt_tokens} and {data.max_response_tokens}) so "
            f"that their sum is at most {context}."
        )


def _check_finite(margins: torch.Tensor, examples, reward_model: str) -> None:
    require_finite_scores(
        margins,
        model=f"the reward model {reward_model}",
        what="pairs, at",
        row=lambda i: _source(examples[i]),
        consequence="No result was written.",
        fix="the reward model is broken (diverged training or damaged weights): retrain it with `rlhf rm`.",
        limit=5,
    )


def _source(example) -> str:
    return str(example.source) if example.source is not None else ""


def _pair_record(example, chosen: float, rejected: float) -> dict:
    return {
        "source": _source(example),
        "margin": chosen - rejected,
        "p_chosen": sigmoid(chosen - rejected),  # the reward model's P(chosen preferred)
        "chosen_score": chosen,
        "rejected_score": rejected,
        "prompt": example.prompt,
        "chosen": example.chosen,
        "rejected": example.rejected,
    }


# --- the one-screen summary -------------------------------------------------------------------


def _clip(text, width: int) -> str:
    if not isinstance(text, str):  # chat messages: the last one is the turn being answered
        text = text[-1]["content"] if text else ""
    text = " ".join(text.split())
    return text if len(text) <= width else "..." + text[-(width - 3) :]


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def length_rows(length: dict) -> dict:
    """The summary's rows of the reward model's length bias."""
    shorter, corr = length["shorter_wins"], length["margin_correlation"]
    low, high = shorter["accuracy_ci95"]
    return {
        "mean length chosen / rejected": f"{_number(length['chosen_mean_length'], '.1f')} / "
        f"{_number(length['rejected_mean_length'], '.1f')} tokens",
        '"shorter wins" accuracy': f"{_number(shorter['accuracy'], '.3f')} [{low:.3f}, {high:.3f}] "
        f"({shorter['equal_length']} of equal length count 1/2)",
        "margin ~ length diff (Pearson / Spearman)": f"{_number(corr['pearson'], '+.3f')} / "
        f"{_number(corr['spearman'], '+.3f')}",
    }


def histogram_lines(histogram: dict, width: int = 30) -> list[str]:
    """One text bar per bin: "[-1.20, -0.90)  ###       3"."""
    counts, edges = histogram["counts"], histogram["edges"]
    top = max(counts) or 1
    return [
        f"  [{edges[i]:+7.3f}, {edges[i + 1]:+7.3f})  {'#' * round(width * c / top):<{width}} {c}"
        for i, c in enumerate(counts)
    ]


def _truncated(truncation: dict) -> str:
    share = truncation.get("prompts_truncated_share")
    if share is None:
        return "-"
    return f"{truncation['prompts_truncated']}/{truncation['prompts']} ({share:.1%})"


def print_rm_eval_summary(result: dict, out: Path, worst_shown: int = 3) -> None:
    margin, cal = result["margin"], result["calibration"]
    low, high = result["accuracy_ci95"]
    over = cal["overconfidence"]
    print_summary(
        f"rm-eval: {result['reward_model']} on {result['data']}",
        {
            "pairs scored": result["n"],
            "skipped (invalid)": result["skipped_invalid"],
            "accuracy (chosen > rejected)": f"{result['accuracy']:.3f} [{low:.3f}, {high:.3f}] (95% Wilson)",
            "ties (margin 0)": result["ties"],
            "margin mean ± std": f"{margin['mean']:.4f} ± {margin['std']:.4f}",
            "margin p05 / median / p95": f"{margin['p05']:.4f} / {margin['median']:.4f} / {margin['p95']:.4f}",
            "ranking loss": f"{margin['rank_loss']:.4f}",
            "calibration error (ECE)": f"{cal['ece']:.4f}",
            "confidence - accuracy": f"{over:+.4f} ({'overconfident' if over > 0 else 'underconfident'})",
            **length_rows(result["length"]),
            "prompts truncated to the budget": _truncated(result.get("truncation", {})),
        },
    )
    print("margin histogram (left of 0: ranked the wrong way):")
    print("\n".join(histogram_lines(result["histogram"])))
    print("calibration: confidence sigmoid(|margin|) bin -> pairs, mean confidence, observed accuracy")
    for row in result["calibration"]["bins"]:
        if row["n"]:
            print(
                f"  [{row['low']:.2f}, {row['high']:.2f})  n={row['n']:<6} "
                f"confidence {row['confidence']:.3f}  accuracy {row['accuracy']:.3f}"
            )
    for pair in result["worst_pairs"][:worst_shown]:
        print(f"worst {pair['margin']:+.4f} at {pair['source']}  prompt: {_clip(pair['prompt'], 70)}")
        print(f"  chosen:   {_clip(pair['chosen'], 90)}")
        print(f"  rejected: {_clip(pair['rejected'], 90)}")
    print(f"written: {out}")
