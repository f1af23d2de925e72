"""Two groups of `rlhf train` about what runs outside the trainer's own forwards: a reward server
(`reward.remote`, docs/reward_server.md) and the gap between the sampler's log-probs and the
trainer's (`log.mismatch`, docs/monitors.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rlhf.config.checks import refuse
from rlhf.config.keys import When, setting

WITH_URL = When(
    "url",
    "set",
    says="--reward-url URL is given ({key})",
    fix="--reward-url URL",
    example="http://127.0.0.1:8000",
)


@dataclass
class RemoteRewardConfig:
    # a reward server's base URL (`rlhf serve-rm`, or any server speaking docs/reward_server.md's
    # format): its score stands for the reward model's (reward.model_weight applies); "": none
    url: str = ""
    # seconds one request may take before it counts as failed
    timeout: float = setting(60.0, "> 0", unit="seconds", when=WITH_URL)
    # further attempts after a failed one (refused, reset, timed out, HTTP 429/5xx); 0: one attempt
    retries: int = setting(3, ">= 0", when=WITH_URL)
    # seconds before the first retry, doubled before each next one
    backoff: float = setting(0.5, ">= 0", unit="seconds", when=WITH_URL)
    # responses sent in one request (a rollout is split into several)
    rows_per_request: int = setting(256, ">= 1", unit="responses", when=WITH_URL)
    # the NAME of the environment variable holding the server's bearer token (`rlhf serve-rm
    # --token-env`); the token itself is never in a config; "": send none
    token_env: str = setting("", when=WITH_URL)

    def validate(self, prefix: str) -> None:
        if self.url:
            check_url(self.url, f"{prefix}url")
        if self.token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.token_env):
            refuse(
                f"{prefix}token_env {self.token_env!r} is not the name of an environment variable. Fix: "
                f"give the variable's name, not the token (e.g. --reward-token-env RLHF_REWARD_TOKEN after "
                "export RLHF_REWARD_TOKEN=...).",
                f"{prefix}token_env",
            )


def check_url(url: str, key: str, fix: str | None = None) -> None:
    """An http(s) URL with a host (and a valid port, if any), no query or fragment; `fix` says what
    to pass instead (default: a reward server's address)."""
    fix = fix or f"--{key} http://HOST:PORT (e.g. http://127.0.0.1:8000, where `rlhf serve-rm` listens)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number in 0-65535)
    except ValueError as err:
        refuse(f"{key} {url!r} is not a URL ({err}). Fix: {fix}.", key)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        refuse(f"{key} {url!r} is not an http:// or https:// URL with a host. Fix: {fix}.", key)
    if parts.query or parts.fragment:
        refuse(f"{key} {url!r} has a query or fragment; give the server's base URL. Fix: {fix}.", key)


@dataclass
class MismatchConfig:
    # measure the sampler/trainer log-prob gap every N iterations, on iterations where the trainer
    # computes the old log-probs itself (the default: the sampler's come free); 0: off
    every: int = setting(1, ">= 0", unit="iterations")
    # with rollout.logprobs_from_sampler (no trainer forward for the old log-probs): one more policy
    # forward every N iterations to measure it; 0: not measured
    extra_forward_every: int = setting(
        0,
        ">= 0",
        unit="iterations",
        when=When("rollout.logprobs_from_sampler", True, root=True),
    )
    # warn (code sampler_trainer_mismatch) when mismatch/kl exceeds this; null: never (bfloat16 on a
    # CPU measured 1.3e-3 on SmolLM2-135M, float32 3e-11: docs/monitors.md#sampler-trainer-mismatch)
    kl_threshold: float | None = setting(0.01, "> 0", unit="nats")
