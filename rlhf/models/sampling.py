"""Sampling responses: our own KV-cache loop over a Hugging Face causal LM.

Prompts come left-padded ([B, P], the last column real in every row). Each step feeds one token per
row, positions continuing from the mask; a row stops at its EOS (kept, mask 1), is padded afterwards
(mask 0), and the loop exits once every row has ended; responses are trimmed to the longest. Per step:
repetition penalty on the raw logits, temperature, top-k, top-p, then a draw (or argmax). Everything
runs on the model's device; off the CPU "has every row ended?" is read every `finished_check_every`
steps (same tokens). The engines (rlhf/models/decoding.py) change how a step runs, not the tokens.
In lockstep (`all_ranks_done`: FSDP2 gathering each layer) the loop exits once every rank's rows have
ended, a finished rank stepping one masked row along.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlhf.config import PAPER_SAMPLING
from rlhf.models.backbone import causal_lm_parts, eval_mode, output_head, position_ids
from rlhf.models.decoding import ENGINES, Engine, engine_steps, resolve_engine
from rlhf.models.device import model_device, same_device
from rlhf.models.packed_linear import MIN_PACKED_NEW_TOKENS, packed_linears
from rlhf.models.sequences import Sequences

# Default decode steps between two finished-rows checks off the CPU: a check waits for the device
# to drain its queue; at most this many steps are spent on a batch whose rows have all ended.
FINISHED_CHECK_EVERY_ACCELERATOR = 8


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 64  # response length limit (a response that hits it did not end with EOS)
    temperature: float = 1.0  # logits are divided by it (response_logprobs must get the same value)
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens with probability >= top_p (1 = off)
    top_k: int = 0  # keep the k most likely tokens (0 = off)
    repetition_penalty: float = 1.0  # CTRL: logit/p if > 0 else logit*p for seen tokens (1 = off)
    do_sample: bool = True  # False: greedy (argmax after the repetition penalty)
    stop_at_eos: bool = True  # a row stops at its first EOS
    # rows that ended leave the decoder's batch (their KV-cache rows are dropped), so the steps of a
    # mixed-length batch get cheaper as it drains; the tokens drawn are the same either way
    drop_finished_rows: bool = True
    # on a CPU, linear layers read a oneDNN-prepacked copy of their weights for the call (faster decode
    # steps; products equal to float rounding; the copies take the linear weights' size; not for fewer
    # than MIN_PACKED_NEW_TOKENS new tokens: packed_linear.py)
    pack_weights: bool = True
    # read "has every row ended?" (a host-device sync) every N decode steps; None: 1 on a CPU (no sync
    # to save there), FINISHED_CHECK_EVERY_ACCELERATOR elsewhere. Same tokens whatever N: it only
    # decides when the loop may exit and when finished rows leave the batch
    finished_check_every: int | None = None
    # how each decode step runs (rlhf/models/decoding.py): "eager" (a KV cache grown per step),
    # "static" (preallocated, fixed shapes), "cuda_graph" (static, the step replayed from a CUDA
    # graph), "compiled" (static, torch.compile's step, replayed on CUDA), "auto" (the fastest measured
    # on the model's device, rlhf/models/decoding.py). Same tokens whichever
    engine: Engine = "auto"

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 1, "max_new_tokens", "an integer >= 1"),
            (self.temperature > 0, "temperature", "> 0 (use do_sample=False for greedy)"),
            (0 < self.top_p <= 1, "top_p", "in (0, 1] (1 = off)"),
            (self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)"),
            (self.repetition_penalty > 0, "repetition_penalty", "> 0 (1 = off)"),
            (
                self.finished_check_every is None or self.finished_check_every >= 1,
                "finished_check_every",
                "an integer >= 1, or None (1 on a CPU, 8 on an accelerator)",
            ),
            (self.engine in ENGINES, "engine", "one of " + ", ".join(ENGINES)),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"SamplingConfig.{name} must be {expected}, got {getattr(self, name)!r}.")

    @classmethod
    def ppo_paper(cls, max_new_tokens: int = 64) -> SamplingConfig:
        """The sampling of PPO paper §6.1 (Secrets of RLHF Part I): temperature 0.8, top-p 0.9,
        repetition penalty 1.1 (`rlhf.config.PAPER_SAMPLING`, which `rollout.sampling: paper` reads)."""
        return cls(max_new_tokens=max_new_tokens, **PAPER_SAMPLING)

    def check_every(self, device: torch.device) -> int:
        """Decode steps between two reads of "has every row ended?" on `device`."""
        if self.finished_check_every is not None:
            return self.finished_check_every
        return 1 if device.type == "cpu" else FINISHED_CHECK_EVERY_ACCELERATOR


@dataclass(frozen=True)
class RowShare:
    """Rows `start:stop` of a batch of `batch_size` prompts, sampled here while other processes
    sample the rest (data parallelism). Each step draws the uniforms of the whole batch and uses
    those of these rows, so the tokens are the ones a single process sampling the whole batch
    draws for them, from the same generator state."""

    start: int
    stop: int
    batch_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop <= self.batch_size:
            raise ValueError(
                f"RowShare rows {self.start}:{self.stop} are not inside a batch of {self.batch_size}."
            )

    @property
    def rows(self) -> int:
        return self.stop - self.start


def skip_draws(generator: torch.Generator | None, batch_size: int, steps: int, device: torch.device) -> None:
    """Advance `generator` as `steps` more decode steps of a `batch_size`-row batch would (one
    uniform per row each, drawn as `_sample_loop` draws them): a process whose share of the rows
    ended early catches up with the one that ran longest."""
    for _ in range(steps):
        torch.rand(batch_size, 1, generator=generator, device=device, dtype=torch.float32)


@dataclass
class Rollout:
    """A sampled batch in the layout of docs/internals.md."""

    input_ids: torch.Tensor  # [B, P + T] left-padded prompt | right-padded response
    attention_mask: torch.Tensor  # [B, P + T] 1 on real tokens (EOS included)
    prompt_length: int  # P
    response_mask: torch.Tensor  # [B, T] float, 1 on real response tokens (EOS included)
    ended_with_eos: torch.Tensor  # [B] bool: the last real token is an EOS (False: cut at max_new_tokens)
    # [B, T] log-prob of each sampled token under softmax(raw logits / temperature), 0 at padding;
    # only with generate(..., return_logprobs=True). Same quantity as response_logprobs, read from the
    # sampler's KV-cached forward (equal to float rounding, ~1e-6 in float32).
    logprobs: torch.Tensor | None = None
    # decode steps the loop ran: each drew one uniform per row of the (whole) batch when sampling
    decode_steps: int = 0

    @property
    def sequences(self) -> Sequences:
        return Sequences(self.input_ids, self.attention_mask, self.prompt_length)

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length :]

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1).long()

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.input_ids[:, : self.prompt_length]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.attention_mask[:, : self.prompt_length]


# -- logits processing (each a pure function, tested against plain loops) ----------------------


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL (Keskar et al. 2019): for tokens already in prompt + response (`seen` [B, V] bool),
    divide positive logits by `penalty` and multiply negative ones by it."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


# Candidate-set sizes tried before a full sort for top-p: a nucleus usually holds few tokens, and
# top-k over a large vocabulary costs a fraction of a full sort (49k vocabulary: ~7 ms vs ~55 ms
# for 16 rows on one core).
TOP_P_CANDIDATES = (256, 4096)


def candidate_logits(
    logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, search_candidates: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens that survive top-k then top-p, as (logits [B, K] sorted descending with -inf on
    removed entries, token ids [B, K]). K = V (a full sort) only when the nucleus needs it.

    top-k keeps exactly k tokens (ties at the k-th broken by `torch.topk`). top-p (Holtzman et
    al. 2020) keeps the most likely tokens until their probability reaches `top_p`, the token that
    crosses it included, the most likely one always; the probabilities are those after top-k.
    Off the CPU the candidate sets are skipped (testing them needs a host-device sync; a sort is fast);
    `search_candidates` overrides that choice (None: search on the CPU only).
    """
    if search_candidates is None:
        search_candidates = logits.device.type == "cpu"
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        values, ids = torch.topk(logits, top_k, dim=-1)
        log_norm = torch.logsumexp(values, dim=-1, keepdim=True)
    else:
        values = ids = None
        log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    if top_p >= 1.0:
        if values is None:
            values, ids = torch.sort(logits, dim=-1, descending=True)
        return values, ids
    if values is None and search_candidates:
        for size in TOP_P_CANDIDATES:
            if size >= vocab:
                break
            values, ids = torch.topk(logits, size, dim=-1)
            if bool((torch.exp(values - log_norm).sum(-1) >= top_p).all()):
                break  # every row's nucleus lies inside these candidates
            values = ids = None
    if values is None:  # off the CPU (no candidate sets), or no candidate set held every nucleus
        values, ids = torch.sort(logits, dim=-1, descending=True)
    probs = torch.exp(values - log_norm)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    remove = mass_before >= top_p
    remove[..., 0] = False
    return values.masked_fill(remove, float("-inf")), ids


def _scatter_back(logits: torch.Tensor, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, float("-inf")).scatter(-1, ids, values)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Full-vocabulary logits with every token but the k most likely set to -inf (k <= 0: off)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    return _scatter_back(logits, *candidate_logits(logits, top_k=k))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Full-vocabulary logits with every token outside the nucleus of mass `p` set to -inf."""
    if p >= 1.0:
        return logits
    return _scatter_back(logits, *candidate_logits(logits, top_p=p))


def sample_categorical(
    weights: torch.Tensor, generator: torch.Generator | None = None, uniforms: torch.Tensor | None = None
) -> torch.Tensor:
    """One index per row [B] drawn with probability proportional to `weights` [B, N] (>= 0, each
    row with a positive sum), by inverting the cumulative sum: one uniform per row, drawn from
    `generator` or given as `uniforms` [B, 1]. A zero weight is never drawn. (torch.multinomial
    costs ~10x more on a 49k vocabulary.)"""
    cdf = torch.cumsum(weights, dim=-1)
    u = uniforms
    if u is None:
        u = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device, dtype=cdf.dtype)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    # u * total rounding up to total would run off the end: take the last token with weight then.
    overflow = index >= weights.shape[-1]
    # on the CPU, test first (rare, and the test costs nothing); elsewhere always (no sync)
    if weights.device.type != "cpu" or bool(overflow.any()):
        last_positive = weights.shape[-1] - 1 - (weights.flip(-1) > 0).int().argmax(-1)
        index = torch.where(overflow, last_positive, index)
    return index


def next_tokens(
    logits: torch.Tensor,
    config: SamplingConfig,
    seen: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row [B] from next-token logits [B, V] under `config` (a draw uses one uniform
    per row: from `generator`, or `uniforms` [B, 1] when given)."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, config.repetition_penalty)
    if not config.do_sample:
        return logits.argmax(dim=-1)
    if config.temperature != 1.0:
        logits = logits / config.temperature
    if 0 < config.top_k < logits.shape[-1] or config.top_p < 1.0:
        values, ids = candidate_logits(logits, config.top_k, config.top_p)
        weights = torch.exp(values - values[:, :1])  # the first candidate is the row's maximum
        return ids.gather(-1, sample_categorical(weights, generator, uniforms).unsqueeze(-1)).squeeze(-1)
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    return sample_categorical(weights, generator, uniforms)


# -- the loop -----------------------------------------------------------------------------------


def _check_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must both be [B, P]."
        )
    if prompt_ids.shape[1] == 0:
        raise ValueError("prompts are empty (P = 0): every prompt needs at least one token (e.g. BOS).")
    not_left_padded = (prompt_mask[:, -1] == 0).nonzero().flatten()
    if len(not_left_padded):
        raise ValueError(
            f"prompt rows {not_left_padded.tolist()} end with padding: prompts must be left-padded with at "
            "least one real token. Fix: pad them with rlhf.data.collate.left_pad."
        )


def _eos_tensor(eos_token_id: int | Sequence[int], device: torch.device) -> torch.Tensor:
    if eos_token_id is None:
        raise ValueError("eos_token_id is None: give the tokenizer's EOS id (see prepare_tokenizer).")
    ids = torch.as_tensor(eos_token_id, dtype=torch.long, device=device).flatten()
    if ids.numel() == 0:
        raise ValueError("eos_token_id is empty: give the tokenizer's EOS id.")
    return ids


def _seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] bool: which tokens occur among the real prompt tokens (pads ignored, duplicates fine)."""
    counts = torch.zeros(prompt_ids.shape[0], vocab_size, dtype=torch.int32, device=prompt_ids.device)
    counts.scatter_add_(1, prompt_ids, prompt_mask.to(torch.int32))
    return counts > 0


@functools.cache
def cache_keyword(decoder_class: type) -> str:
    """The keyword argument a decoder's `forward` takes the KV cache by: `cache` where transformers
    has renamed it (its `past_key_values` is deprecated there and removed in 5.40), else
    `past_key_values` (transformers before the rename, and decoders outside transformers). Read from
    the signature once per class: a `**kwargs` forward of an older version would swallow `cache`
    silently, and decode without a cache."""
    parameters = inspect.signature(decoder_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _sample_loop(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: SamplingConfig,
    eos_ids: torch.Tensor,
    pad_token_id: int,
    generator: torch.Generator | None,
    return_logprobs: bool = False,
    share: RowShare | None = None,
    all_ranks_done: Callable[[bool], bool] | None = None,
    engine: str = "eager",
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None, int]:
    """(tokens [B, max_new], mask [B, C], T, log-probs [B, max_new] or None, steps run), C >= P + max_new
    the engine's columns (its first P + T hold the rollout),
    T the longest response; runs under inference mode. With `share`, the B rows are the share's
    and each step draws the uniforms of the share's whole batch.

    The decoder's batch holds the rows in `active` (batch indices); with `drop_finished_rows`, rows
    that ended leave it once a quarter of it has ended (amortizing the KV-cache copy). Each step
    still draws one uniform for every row of the batch, so the random stream, and the tokens, are
    those of a loop that keeps every row. Which rows ended is read on the host (a device sync) only
    every `config.check_every(device)` steps: the loop's only sync besides the last line.
    `all_ranks_done` (lockstep): given whether this rank's rows have all ended, whether every
    rank's have; called at those checks on every rank (a collective), the loop exits on its answer.
    `engine` (resolved: eager, static, cuda_graph or compiled) runs the forwards (rlhf/models/decoding.py);
    an engine whose shapes are fixed for the call (cuda_graph, compiled) keeps every row in its batch."""
    decoder, _ = causal_lm_parts(model)
    head = output_head(model)
    batch, prompt_len = prompt_ids.shape
    device = prompt_ids.device
    max_new = config.max_new_tokens
    keyword, by_auto = cache_keyword(type(decoder)), config.engine == "auto"
    steps_engine = engine_steps(engine, decoder, head, keyword, prompt_len + max_new, max_new - 1, by_auto)
    # the engine's columns: prompt + max_new, or more for one whose cache length is bucketed (compiled)
    mask = torch.zeros(batch, steps_engine.columns, dtype=torch.long, device=device)
    mask[:, :prompt_len] = prompt_mask
    tokens = torch.full((batch, max_new), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(batch, max_new, device=device) if return_logprobs else None
    active = torch.arange(batch, device=device)  # batch rows in the decoder's batch, in order

    next_position = position_ids(prompt_mask)
    logits = steps_engine.prefill(prompt_ids, mask, active, next_position)
    next_position = next_position[:, -1:] + 1
    seen = None
    if config.repetition_penalty != 1.0:
        seen = _seen_tokens(prompt_ids, prompt_mask, logits.shape[-1])
    drop_rows = config.drop_finished_rows and steps_engine.can_drop_rows
    running = torch.ones(batch, dtype=torch.bool, device=device)  # per row of the decoder's batch
    check_every = config.check_every(device)
    drawn_rows = share.batch_size if share is not None else batch
    first_row = share.start if share is not None else 0

    steps = 0
    for step in range(max_new):
        uniforms = None
        if config.do_sample:  # one per row of the whole batch, as if no row had left
            uniforms = torch.rand(drawn_rows, 1, generator=generator, device=device, dtype=torch.float32)
            uniforms = uniforms[first_row : first_row + batch][active]
        drawn = next_tokens(logits, config, seen, generator, uniforms)
        chosen = torch.where(running, drawn, torch.full_like(drawn, pad_token_id))
        tokens[active, step] = chosen
        mask[active, prompt_len + step] = running.long()  # the EOS itself is a real token
        if logprobs is not None:  # the behaviour policy's log-prob, as response_logprobs computes it
            logprobs[active, step] = torch.where(
                running, _token_logprob(logits, chosen, config.temperature), 0.0
            )
        steps = step + 1
        if config.stop_at_eos:
            running &= ~torch.isin(chosen, eos_ids)
        if config.stop_at_eos and steps % check_every == 0:
            still = int(running.sum())
            if still == 0 if all_ranks_done is None else all_ranks_done(still == 0):
                break  # every row has ended (on every rank): exit early, T = longest response
            if drop_rows and 4 * still <= 3 * len(active) and len(active) > 1:
                active, running, chosen, next_position, seen = _running_rows(
                    steps_engine, running, active, chosen, next_position, seen
                )
        if steps == max_new:
            break
        if seen is not None:
            seen[torch.arange(len(active), device=device), chosen] = True
        logits = steps_engine.step(chosen, mask, active, prompt_len + steps, next_position)
        next_position = next_position + 1
    # rows may all have ended before the last check: T is the longest response, not the steps run
    longest = int(mask[:, prompt_len : prompt_len + steps].sum(-1).max()) if config.stop_at_eos else steps
    return tokens, mask, longest, logprobs, steps


def _running_rows(steps_engine, running, active, chosen, next_position, seen):
    """The decoder's batch narrowed to its running rows, the KV cache reordered with it (lockstep:
    when none runs, one ended row steps along while the other ranks still decode)."""
    keep = running.nonzero().squeeze(1)
    if len(keep) == 0:
        keep = keep.new_zeros(1)
    steps_engine.keep_rows(keep)
    narrowed = seen[keep] if seen is not None else None
    return active[keep], running[keep], chosen[keep], next_position[keep], narrowed


def _token_logprob(logits: torch.Tensor, chosen: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `chosen` [B]: no repetition penalty, no top-k/top-p,
    the distribution response_logprobs scores (logprobs.py)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def generate(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: SamplingConfig,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    return_logprobs: bool = False,
    share: RowShare | None = None,
    all_ranks_done: Callable[[bool], bool] | None = None,
) -> Rollout:
    """Sample one response per left-padded prompt. The model runs in eval mode (restored after).

    Devices: the prompts are moved to the model's device, `generator` must be on that device, and
    the rollout's tensors are on it. `generator` makes sampling reproducible (the same seed draws
    different numbers on a CPU and on a GPU: their generators differ). A response
    ends at its first EOS (`eos_token_id`: one id or several) or at `max_new_tokens`; positions
    after it hold `pad_token_id` with mask 0 (masks never compare ids with the pad id, so the pad
    id may equal the EOS id). `return_logprobs` also fills `Rollout.logprobs` (the sampled tokens'
    log-probs at `config.temperature`), which saves the trainer a forward pass for the old log-probs.
    `share`: the prompts are rows `share.start:share.stop` of a larger batch sampled by several
    processes (their tokens are the whole batch's; rlhf/parallel/rollout_share.py joins the shares).
    `all_ranks_done`: the processes decode in lockstep, each running as many steps as the longest
    (`_sample_loop`); `decode_steps` is then the same on every one.
    """
    device = model_device(model)
    if generator is not None and not same_device(generator.device, device):
        raise ValueError(
            f"the generator is on {generator.device} but the model is on {device}; sampling draws on the "
            f"model's device. Fix: torch.Generator(device='{device}').manual_seed(seed)."
        )
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    _check_prompts(prompt_ids, prompt_mask)
    if share is not None and share.rows != prompt_ids.shape[0]:
        raise ValueError(f"{prompt_ids.shape[0]} prompt rows given for a RowShare of {share.rows} rows.")
    if pad_token_id is None:
        raise ValueError("pad_token_id is None: give the tokenizer's pad id (prepare_tokenizer sets one).")
    eos_ids = _eos_tensor(eos_token_id, prompt_ids.device)
    rows, width = prompt_ids.shape
    call_shape = (rows, width + config.max_new_tokens, config.max_new_tokens - 1)
    engine = resolve_engine(config.engine, device, model, all_ranks_done is not None, call_shape)
    # a batch of one decodes one row per step, which the packed weights do not speed up (packed_linear.py);
    # a compiled step has inductor's own kernels (the packed product is an op it cannot lower)
    pack = (
        config.pack_weights
        and config.max_new_tokens >= MIN_PACKED_NEW_TOKENS
        and prompt_ids.shape[0] > 1
        and engine != "compiled"
    )
    with torch.inference_mode(), eval_mode(model), packed_linears(model, enabled=pack):
        tokens, mask, steps, logprobs, decode_steps = _sample_loop(
            model,
            prompt_ids,
            prompt_mask.long(),
            config,
            eos_ids,
            pad_token_id,
            generator,
            return_logprobs,
            share,
            all_ranks_done,
            engine,
        )
    # Clone outside inference mode: the trainer uses these tensors in autograd graphs.
    prompt_len = prompt_ids.shape[1]
    response = tokens[:, :steps].clone()
    attention_mask = mask[:, : prompt_len + steps].clone()
    response_mask = attention_mask[:, prompt_len:].float()
    lengths = response_mask.sum(-1).long()
    last_token = response.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ended_with_eos = torch.isin(last_token, eos_ids) & (lengths > 0)
    return Rollout(
        input_ids=torch.cat([prompt_ids.clone(), response], dim=1),
        attention_mask=attention_mask,
        prompt_length=prompt_len,
        response_mask=response_mask,
        ended_with_eos=ended_with_eos,
        logprobs=logprobs[:, :steps].clone() if logprobs is not None else None,
        decode_steps=decode_steps,
    )
