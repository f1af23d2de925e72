"""Prompt and PPO-ptx files read into token ids: what `rlhf train` and `rlhf eval` do with their
`--prompts` and `data.ptx` paths."""

from __future__ import annotations

from rlhf.data.collate import PtxBatches
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import encode_prompt, encode_sft


def encode_prompts(tokenizer, path: str, **options) -> list[list[int]]:
    """The encoded prompts of `path` (`load_prompts` without the sources)."""
    return load_prompts(tokenizer, path, **options)[0]


def load_prompts(
    tokenizer,
    path: str,
    *,
    format: str,
    max_tokens: int,
    skip_invalid: bool,
    stats=None,
    chat_template: bool | str = "auto",
    system_prompt: str = "template",
) -> tuple[list[list[int]], list]:
    """The encoded prompts of `path` and the source (file, line) of each."""
    loaded = load_examples(path, kind="prompt", format=format, skip_invalid=skip_invalid)
    ids = [
        encode_prompt(tokenizer, ex.prompt, max_tokens, stats, chat_template, system_prompt)
        for ex in loaded.examples
    ]
    return ids, [ex.source for ex in loaded.examples]


def prompt_rows(path: str, sources: list) -> list[dict]:
    """The prompt file's record of each source (every field of its line, for reward functions)."""
    from rlhf.data.loading import _records

    by_source = {(str(s.file), s.line): r for s, r in _records(path) if isinstance(r, dict)}
    return [dict(by_source.get((str(s.file), s.line), {})) for s in sources]


def ptx_sampler(
    tokenizer,
    path: str,
    batch_size: int,
    max_prompt_tokens: int,
    max_response_tokens: int = 256,
    chat_template: bool | str = "auto",
    system_prompt: str = "template",
) -> PtxBatches:
    """The PPO-ptx rows of the SFT file `path`, encoded (the policy draws its batches: `PtxBatches.draw`)."""
    loaded = load_examples(path, kind="sft")
    rows = [
        encode_sft(
            tokenizer,
            ex,
            max_prompt_tokens,
            max_response_tokens,
            chat_template=chat_template,
            system_prompt=system_prompt,
        )
        for ex in loaded.examples
    ]
    return PtxBatches(rows, batch_size, tokenizer.pad_token_id)
