"""Rows that do not fit the model: every prompt plus the response budget (`rlhf train`, `rlhf eval`),
and every training row, prompt and response (`rlhf sft`, `rlhf rm`, `rlhf dpo`), must fit its positions.

Past its trained positions a model either fails (GPT-2's position table: an IndexError, and only
when such a row is batched) or runs on silently with untrained positions (rotary models such as
Llama). Both are caught at load time instead, naming the first row that does not fit.
"""

from __future__ import annotations

from rlhf.data.errors import DataError, Source


def check_prompts_fit(
    prompt_ids: list[list[int]],
    sources: list[Source | None],
    *,
    context: int | None,
    max_new_tokens: int,
    model_name: str,
    fix: str,
    budget_flag: str = "--rollout.max_new_tokens",
) -> None:
    """Raise DataError at the first prompt whose tokens plus `max_new_tokens` exceed `context`.

    `fix` is the remedy the command offers, with `{budget}` for the prompt budget that fits;
    `budget_flag` sets `max_new_tokens` (named when the response budget alone is too large).
    """
    if context is None:
        return
    budget = context - max_new_tokens
    too_long = [i for i, ids in enumerate(prompt_ids) if len(ids) > budget]
    if not too_long:
        return
    first = too_long[0]
    where = sources[first] or Source("prompt #" + str(first + 1))
    if budget < 1:
        raise DataError(
            where,
            f"the response budget ({max_new_tokens} new tokens) alone fills the {context} positions of {model_name}",
            f"{budget_flag} {max(1, context // 4)} (any budget below {context} leaves room for a prompt)",
        )
    raise DataError(
        where,
        f"the prompt has {len(prompt_ids[first])} tokens; with {max_new_tokens} new tokens it needs "
        f"{len(prompt_ids[first]) + max_new_tokens} positions, and {model_name} has {context} "
        f"({len(too_long)} of {len(prompt_ids)} prompts do not fit)",
        fix.format(budget=budget),
    )


def check_rows_fit(
    positions: list[int],
    sources: list[Source | None],
    *,
    context: int | None,
    model_name: str,
    max_prompt_tokens: int,
    max_response_tokens: int,
    what: str = "row",
) -> None:
    """Raise DataError at the first training row (prompt and response tokens, as truncated) that
    needs more than the model's `context` positions; `positions[i]`: what row i's forward needs."""
    if context is None:
        return
    too_long = [i for i, n in enumerate(positions) if n > context]
    if not too_long:
        return
    first = too_long[0]
    raise DataError(
        sources[first] or Source(f"{what} #{first + 1}"),
        f"the {what} needs {positions[first]} positions (prompt and response tokens) and {model_name} has "
        f"{context} ({len(too_long)} of {len(positions)} {what}s do not fit)",
        f"lower --data.max_prompt_tokens or --data.max_response_tokens (now {max_prompt_tokens} and "
        f"{max_response_tokens}) so that their sum is at most {context}, or shorten those {what}s",
    )
