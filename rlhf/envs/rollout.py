"""Multi-turn rollouts: episodes that alternate policy turns and environment replies
(docs/environments.md), sampled through the ordinary one-turn `generate` call.

Each turn, the contexts of every live episode go to ONE batched `generate` call; an episode that is
done, or reached `max_turns` or the token budget, leaves the batch. A row's response block is
[turn 1, reply 1, turn 2, ...] after its prompt: `attention_mask` 1 on every real token,
`response_mask` 1 on the policy's tokens only (every loss, KL, advantage and metric leaves the
environment's out). An episode always ends with a policy turn, so a reward model scores, and
`token_rewards` puts the score, at the last real token of the row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlhf.config.outside import outside_number
from rlhf.data.collate import left_pad
from rlhf.envs.protocol import EnvError, EnvironmentClass
from rlhf.models.sampling import Rollout


@dataclass
class Episodes:
    """A batch of finished episodes: the rollout and what the environment said of each."""

    rollout: Rollout  # the layout above; `logprobs` 0 on environment tokens (when asked for)
    rewards: torch.Tensor  # [B] float: the sum of each episode's turn rewards
    turn_rewards: torch.Tensor  # [B, T] float: each turn's reward at that turn's last token, 0 elsewhere
    turns: torch.Tensor  # [B] long: policy turns taken
    done: torch.Tensor  # [B] bool: the environment ended the episode (False: a turn or token limit did)
    transcripts: list[str]  # each response block as text: the turns and the replies in order

    def metrics(self) -> dict[str, float]:
        """`env/*` monitors of the batch."""
        mask = self.rollout.response_mask
        reply_tokens = self.rollout.attention_mask[:, self.rollout.prompt_length :].sum(-1) - mask.sum(-1)
        return {
            "env/reward_mean": float(self.rewards.mean()),
            "env/turns_mean": float(self.turns.float().mean()),
            "env/done_fraction": float(self.done.float().mean()),
            "env/reply_tokens_mean": float(reply_tokens.float().mean()),
        }


@dataclass
class _Episode:
    prompt: list[int]
    env: object
    index: int  # the prompt file's row
    tokens: list[int]  # the response block so far
    policy: list[bool]  # per token: the policy's (True) or the environment's (False)
    logprobs: list[float]
    turn_ends: list[int]  # the position of each turn's last token
    turn_rewards: list[float]
    ended_with_eos: bool = False
    done: bool = False
    over: bool = False


def run_episodes(
    generate: Callable[[list[list[int]]], Rollout],
    tokenizer,
    prompts: Sequence[list[int]],
    envs: Sequence[object],
    environment: EnvironmentClass,
    *,
    max_turns: int,
    max_tokens: int,
    rows: Sequence[int] | None = None,
    return_logprobs: bool = False,
) -> Episodes:
    """Run one episode per prompt (`envs[i]` built from its row) to its end: the environment's done,
    `max_turns` policy turns, or `max_tokens` response tokens (turns and replies; a turn that passes
    it is cut there, a reply that would pass it is not appended, and the episode ends).

    `generate(contexts)` samples one turn for each context (token ids, any lengths), as the
    trainer's `runtime.generate` does; `rows[i]` is the prompt file's row of episode i (for messages)."""
    if max_turns < 1 or max_tokens < 1:
        raise ValueError(f"max_turns and max_tokens must be >= 1, got {max_turns} and {max_tokens}")
    episodes = [
        _Episode(list(p), env, rows[i] if rows is not None else i, [], [], [], [], [])
        for i, (p, env) in enumerate(zip(prompts, envs, strict=True))
    ]
    decode_steps, device = 0, None
    for turn in range(max_turns):
        live = [e for e in episodes if not e.over]
        if not live:
            break
        sampled = generate([e.prompt + e.tokens for e in live])  # every live episode in one batch
        decode_steps += sampled.decode_steps
        device = sampled.response_mask.device
        lengths = sampled.response_mask.sum(-1).long().tolist()
        ids = sampled.response_ids.tolist()
        logprobs = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        for j, e in enumerate(live):
            n = min(lengths[j], max_tokens - len(e.tokens))  # cut at the token budget
            cut = n < lengths[j]
            e.tokens += ids[j][:n]
            e.policy += [True] * n
            e.logprobs += logprobs[j][:n] if logprobs is not None else [0.0] * n
            e.ended_with_eos = bool(sampled.ended_with_eos[j]) and not cut
            text = tokenizer.decode(ids[j][: n - 1 if e.ended_with_eos else n], skip_special_tokens=True)
            reply, reward, e.done = environment.step(e.env, text, e.index, turn)
            if n:
                e.turn_ends.append(len(e.tokens) - 1)
                e.turn_rewards.append(reward)
            elif e.turn_ends:  # an empty (cut) turn: its reward joins the last turn's
                e.turn_rewards[-1] += reward
            else:  # no token at all (max_tokens reached before the turn): nowhere to put it
                e.turn_ends.append(-1)
                e.turn_rewards.append(reward)
            reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"] if reply else []
            e.over = e.done or cut or turn == max_turns - 1 or len(e.tokens) + len(reply_ids) >= max_tokens
            if not e.over:
                e.tokens += reply_ids
                e.policy += [False] * len(reply_ids)
                e.logprobs += [0.0] * len(reply_ids)
    return _assemble(episodes, tokenizer, decode_steps, return_logprobs, device)


def _assemble(episodes, tokenizer, decode_steps: int, return_logprobs: bool, device) -> Episodes:
    """The episodes in the trainer's rollout layout (the module docstring)."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], pad)
    width = max(1, max(len(e.tokens) for e in episodes))
    batch = len(episodes)
    response = torch.full((batch, width), pad, dtype=torch.long)
    real = torch.zeros(batch, width, dtype=torch.long)
    policy = torch.zeros(batch, width)
    logprobs = torch.zeros(batch, width)
    turn_rewards = torch.zeros(batch, width)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        response[i, :n] = torch.tensor(e.tokens, dtype=torch.long)
        real[i, :n] = 1
        policy[i, :n] = torch.tensor(e.policy, dtype=torch.float)
        logprobs[i, :n] = torch.tensor(e.logprobs)
        for end, reward in zip(e.turn_ends, e.turn_rewards):
            if end >= 0:
                turn_rewards[i, end] += reward
    rollout = Rollout(
        input_ids=torch.cat([prompt_ids, response], dim=1),
        attention_mask=torch.cat([prompt_mask, real], dim=1),
        prompt_length=prompt_ids.shape[1],
        response_mask=policy,
        ended_with_eos=torch.tensor([e.ended_with_eos for e in episodes]),
        logprobs=logprobs if return_logprobs else None,
        decode_steps=decode_steps,
    )
    if device is not None:
        rollout = Rollout(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in vars(rollout).items()})
    return Episodes(
        rollout=rollout,
        rewards=torch.tensor([episode_total(e) for e in episodes], device=device),
        turn_rewards=turn_rewards.to(device) if device is not None else turn_rewards,
        turns=torch.tensor([len(e.turn_rewards) for e in episodes], device=device),
        done=torch.tensor([e.done for e in episodes], device=device),
        transcripts=[tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes],
    )


def episode_total(episode: _Episode) -> float:
    """The sum of an episode's turn rewards, checked as every number from outside is: each turn's
    reward fits float32 and so must their sum (two turns of 3e38 do not)."""
    return outside_number(sum(episode.turn_rewards), f"the environment's turn rewards of row {episode.index} summed to",
                          "return turn rewards whose sum over an episode is on a sane scale (e.g. between -10 and "
                          "10)", EnvError)  # fmt: skip


def place_turn_rewards(
    token_rewards: torch.Tensor, turn_rewards: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Token rewards with each turn's reward at its own turn's last token (`env.reward_placement:
    turn`), from `token_rewards` whose last valid token holds the episode's whole score: every
    earlier turn's reward moves from the last valid token to its turn's end, so each row's sum, and
    the last turn's share, are unchanged (`turn_rewards`: [B, T], 0 off the turns' ends; rows with
    no valid token are left as they are)."""
    valid = mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(valid, positions, -1).amax(dim=-1, keepdim=True)
    earlier = torch.where(valid & (positions < last), turn_rewards, 0.0)
    at_last = positions == last
    return token_rewards + earlier - torch.where(at_last, earlier.sum(-1, keepdim=True), 0.0)
