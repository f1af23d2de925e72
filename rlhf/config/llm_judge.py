"""An LLM judge over HTTP (`--judge-url`): an OpenAI-compatible `/chat/completions` server (vLLM,
SGLang, llama.cpp, Ollama, a hosted API) asked for a score (`rlhf train`, `reward.llm_judge`) or a
pairwise verdict (`rlhf eval`, `llm_judge`); rlhf/rl/llm_judge.py is its client (docs/usage.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlhf.config.checks import refuse
from rlhf.config.keys import When, setting
from rlhf.config.remote import check_url

WITH_JUDGE_URL = When(
    "url",
    "set",
    says="--judge-url URL is given ({key})",
    fix="--judge-url URL",
    example="http://127.0.0.1:8000/v1",
)
ENVIRONMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class LLMJudgeConfig:
    # the server's OpenAI base URL, as the openai client's base_url (http://127.0.0.1:8000/v1): the judge
    # posts to URL/chat/completions (--judge-url); "": no LLM judge
    url: str = ""
    model: str = setting("", when=WITH_JUDGE_URL)  # the model name the server serves (--judge-model)
    # the NAME of the environment variable holding the API key, sent as a bearer token; the key itself
    # is never in a config or a log (--judge-key-env); "": send none
    key_env: str = setting("", when=WITH_JUDGE_URL)
    # a prompt template file with {prompt} and {response} (train) or {response_a} and {response_b}
    # (eval); "": the built-in one (--judge-template; docs/usage.md#llm-judge)
    template: str = setting("", when=WITH_JUDGE_URL)
    max_tokens: int = setting(512, ">= 1", unit="tokens", when=WITH_JUDGE_URL)  # of each reply
    temperature: float = setting(0.0, "[0, 2]", when=WITH_JUDGE_URL)  # of each reply; 0: greedy
    # seconds one request may take in all before it counts as failed
    timeout: float = setting(120.0, "> 0", unit="seconds", when=WITH_JUDGE_URL)
    # further attempts after a failed one (refused, reset, timed out, HTTP 429/5xx); 0: one attempt
    retries: int = setting(3, ">= 0", when=WITH_JUDGE_URL)
    # seconds before the first retry, doubled before each next one
    backoff: float = setting(1.0, ">= 0", unit="seconds", when=WITH_JUDGE_URL)
    concurrency: int = setting(8, ">= 1", unit="requests", when=WITH_JUDGE_URL)  # requests in flight
    # the share of a batch's replies that may hold no score or verdict (each one dropped: the response
    # trains nothing, the pair is left out of the win rate); more stops the run (exit 2)
    max_unparsable: float = setting(0.5, "[0, 1)", when=WITH_JUDGE_URL)

    def validate(self, prefix: str) -> None:
        if not self.url:
            return
        check_judge_url(self.url, f"{prefix}url")
        if not self.model:
            refuse(
                f"{prefix}model is empty, and --judge-url {self.url} is given: the server needs the name of "
                "the model to ask. Fix: --judge-model NAME (the id GET URL/models lists, e.g. "
                "Qwen/Qwen2.5-7B-Instruct under vLLM).",
                f"{prefix}model",
            )
        if self.key_env and not ENVIRONMENT_NAME.fullmatch(self.key_env):
            refuse(
                f"{prefix}key_env is not the name of an environment variable. Fix: give the variable's "
                "name, not the key (e.g. --judge-key-env OPENAI_API_KEY after export OPENAI_API_KEY=...).",
                f"{prefix}key_env",
            )


def check_judge_url(url: str, key: str) -> None:
    """An http(s) base URL with a host, no query or fragment."""
    check_url(
        url,
        key,
        "--judge-url http://HOST:PORT/v1 (the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1)",
    )
