"""The record of a sampled batch that every scoring layer reads: each row's prompt, then its response
block as token segments, each the policy's (a turn) or the environment's (a reply), and the
episode's budget of response tokens (docs/environments.md): `rollout.max_new_tokens` for a single
turn, `response_budget(env, max_new_tokens)` for an episode (`--env`), replies included.

    reward model, remote reward   every real token: prompt + every turn + every reply (`token_rows`)
    overlong penalty (DAPO §3.4)  the policy's own tokens against the episode's budget
                                  (`policy_lengths`, `budget`; docs/algorithms.md §37)"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf.models.sampling import Rollout

POLICY, ENVIRONMENT = "policy", "environment"


def token_rows(rollout: Rollout) -> tuple[list[list[int]], list[list[int]]]:
    """(each row's prompt tokens, each row's response block: every real token after the prompt, the
    policy's turns and the environment's replies in order), padding removed: the sequence the local
    reward model reads (its attention mask)."""
    prompts = [
        [t for t, m in zip(ids, mask) if m]
        for ids, mask in zip(rollout.prompt_ids.tolist(), rollout.prompt_mask.tolist())
    ]
    real = rollout.attention_mask[:, rollout.prompt_length :]
    responses = [
        [t for t, m in zip(ids, mask) if m] for ids, mask in zip(rollout.response_ids.tolist(), real.tolist())
    ]
    return prompts, responses


@dataclass(frozen=True)
class EpisodeRecord:
    """A rollout's rows as episodes: the tokens (`rollout`: attention mask 1 on every real token,
    response mask 1 on the policy's) and the response tokens an episode may take."""

    rollout: Rollout
    budget: int  # L_max of the overlong penalty: rollout.max_new_tokens, or the episode's budget

    @property
    def policy_lengths(self) -> torch.Tensor:
        """[B] long: the policy's tokens of each episode (each turn's EOS included; replies not)."""
        return self.rollout.response_lengths

    def token_rows(self) -> tuple[list[list[int]], list[list[int]]]:
        return token_rows(self.rollout)

    def segments(self, row: int) -> list[tuple[str, list[int]]]:
        """Row `row`'s response block as runs of (POLICY or ENVIRONMENT, tokens), in order."""
        real = self.rollout.attention_mask[row, self.rollout.prompt_length :].tolist()
        policy = self.rollout.response_mask[row].tolist()
        runs: list[tuple[str, list[int]]] = []
        for token, is_real, mine in zip(self.rollout.response_ids[row].tolist(), real, policy):
            if not is_real:
                continue
            whose = POLICY if mine else ENVIRONMENT
            if runs and runs[-1][0] == whose:
                runs[-1][1].append(token)
            else:
                runs.append((whose, [token]))
        return runs
