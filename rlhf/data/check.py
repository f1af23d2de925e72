"""`rlhf data check FILE`: validate a data file and describe it before any training starts.

Prints the format, the number of records, length statistics (characters, or tokens with
--tokenizer) and, with a tokenizer and limits, how many prompts and responses would be truncated.
Prompts are encoded as the stages encode them: `--data.system_prompt template|none` is the stages'
`data.system_prompt` (rlhf/data/tokenize.py), so the counts are those `rlhf sft|rm|dpo|train` see.
Returns 0 when every record is valid, and 2 (the exit code of every user error, as `rlhf sft` and
`rlhf train` give for the same file) on bad data (the first bad record, or every one with
--all-errors) or when the tokenizer cannot be used.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from rlhf.data.errors import DataError
from rlhf.data.examples import KINDS, Example, PreferenceExample, SFTExample
from rlhf.data.formats import DEFAULT_KIND, FORMATS
from rlhf.data.loading import LoadResult, detect_file_format, load_examples, scan_examples
from rlhf.data.tokenize import (
    SYSTEM_PROMPTS,
    TruncationStats,
    encode_prompt,
    encode_response,
    plain_chat_text,
)

BAD_DATA = 2  # the user-error exit code of every command (rlhf/cli/errors.py USER_ERROR)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `rlhf data check` to `parser`."""
    parser.add_argument(
        "file", metavar="FILE", help="a .jsonl, .json, .jsonl.gz or .parquet file, or hub:NAME[:SPLIT]"
    )
    parser.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS), help="record format (default: detect)"
    )
    parser.add_argument(
        "--kind",
        default=None,
        choices=KINDS,
        help="what the file will be used for (default: from the format)",
    )
    parser.add_argument(
        "--tokenizer", metavar="DIR", default=None, help="a local tokenizer directory: lengths in tokens"
    )
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=None, metavar="N", help="prompt budget to test"
    )
    parser.add_argument(
        "--max-response-tokens", type=int, default=None, metavar="N", help="response budget to test"
    )
    parser.add_argument(
        "--data.system_prompt",
        dest="system_prompt",
        default="template",
        metavar="template|none",
        help="the chat template's default system prompt, as the stages' data.system_prompt (default: template)",
    )
    parser.add_argument("--all-errors", action="store_true", help="list every bad record, not only the first")
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="report bad records as skipped (as training with --skip-invalid would) and pass if any remain",
    )


def run_check(args: argparse.Namespace) -> int:
    """Run the check described by parsed `args`; returns the exit code."""
    if args.system_prompt not in SYSTEM_PROMPTS:
        print(
            f"error: --data.system_prompt {args.system_prompt!r} is not one of {', '.join(SYSTEM_PROMPTS)}. "
            "Fix: the value the stage you check for runs with: --data.system_prompt template (keep the "
            "chat template's default system prompt; the default) or none (drop it).",
            file=sys.stderr,
        )
        return BAD_DATA
    try:
        fmt = detect_file_format(args.file) if args.format == "auto" else args.format
        kind = args.kind or DEFAULT_KIND[fmt]
        if args.all_errors or args.skip_invalid:
            result = scan_examples(args.file, kind, fmt)
        else:
            result = load_examples(args.file, kind, fmt)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_DATA
    tokenizer = None
    if args.tokenizer is not None:
        try:
            tokenizer = _load_tokenizer(args.tokenizer)
        except (OSError, ValueError) as error:
            print(f"error: cannot load the tokenizer from {args.tokenizer} ({error})", file=sys.stderr)
            return 2
    print(f"file: {args.file}")
    print(f"format: {fmt} (used as {kind} examples{_kind_note(fmt, kind)})")
    print(f"records: {len(result.examples)} valid, {result.skipped} invalid")
    for error in result.errors:
        print(f"{'skipped' if args.skip_invalid else 'error'}: {error}", file=sys.stderr)
    if result.examples:
        try:
            _print_lengths(
                result, tokenizer, args.max_prompt_tokens, args.max_response_tokens, args.system_prompt
            )
        except ValueError as error:  # a tokenizer without EOS, a budget too small, a chat template error
            print(f"error: {error}", file=sys.stderr)
            return 2
    if args.skip_invalid and result.examples:
        print(f"OK with --skip-invalid: {result.skipped} invalid record(s) would be skipped")
        return 0
    if result.errors or not result.examples:
        print(f"FAILED: {result.skipped} invalid record(s)" if result.errors else "FAILED: no records")
        return BAD_DATA
    print("OK")
    return 0


def _kind_note(fmt: str, kind: str) -> str:
    if kind == "prompt" and DEFAULT_KIND[fmt] != "prompt":
        return "; only the prompts are read"
    if kind == "sft" and DEFAULT_KIND[fmt] == "preference":
        return "; the chosen response is the SFT target"
    return ""


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    from rlhf.models.trust import check_model_directory, safe_load_kwargs

    check_model_directory(path, weights=False)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, **safe_load_kwargs(weights=False))


def _response_fields(example: Example) -> dict[str, str]:
    if isinstance(example, PreferenceExample):
        return {"chosen": example.chosen, "rejected": example.rejected}
    if isinstance(example, SFTExample):
        return {"response": example.response}
    return {}


def _print_lengths(
    result: LoadResult,
    tokenizer,
    max_prompt: int | None,
    max_response: int | None,
    system_prompt: str = "template",
) -> None:
    lengths: dict[str, list[int]] = {"prompt": []}
    for example in result.examples:
        if tokenizer is None:
            prompt = example.prompt
            lengths["prompt"].append(len(prompt if isinstance(prompt, str) else plain_chat_text(prompt)))
        else:
            lengths["prompt"].append(
                len(encode_prompt(tokenizer, example.prompt, system_prompt=system_prompt))
            )
        for name, text in _response_fields(example).items():
            size = len(text) if tokenizer is None else len(encode_response(tokenizer, text))
            lengths.setdefault(name, []).append(size)
    unit = "characters" if tokenizer is None else "tokens (responses include EOS)"
    print(f"lengths in {unit}:")
    print(f"  {'field':<10}{'min':>8}{'mean':>10}{'p50':>8}{'p95':>8}{'max':>8}")
    for name, values in lengths.items():
        s = length_summary(values)
        print(f"  {name:<10}{s['min']:>8}{s['mean']:>10.1f}{s['p50']:>8.0f}{s['p95']:>8.0f}{s['max']:>8}")
    if max_prompt is None and max_response is None:
        return
    if tokenizer is None:
        print("truncation: give --tokenizer to count truncations (budgets are in tokens)")
        return
    stats = TruncationStats()
    for example in result.examples:
        encode_prompt(tokenizer, example.prompt, max_prompt, stats, system_prompt=system_prompt)
        for text in _response_fields(example).values():
            encode_response(tokenizer, text, max_response, stats)
    print(
        f"truncation (max prompt tokens {max_prompt}, max response tokens {max_response}): {stats.summary()}"
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating linearly between ranks."""
    position = (len(sorted_values) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def length_summary(values: Sequence[int]) -> dict[str, float]:
    """min, mean, p50, p95 and max of a non-empty list of lengths."""
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "mean": sum(ordered) / len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "max": ordered[-1],
    }
