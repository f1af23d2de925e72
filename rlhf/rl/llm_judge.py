"""An LLM judge over HTTP (`--judge-url`, rlhf/config/llm_judge.py): an OpenAI-compatible server
asked, one chat request per judgement (POST {url}/chat/completions, the template as one user turn),
for a score (`rlhf train`: a reward source) or a verdict between two answers (`rlhf eval`: the
position-swapped win rate, docs/algorithms.md §31, §33). Requests go through the reward server's
client (`JsonClient`: timeouts, retries with backoff, 4xx named), `concurrency` in flight; the API
key is read from the variable `key_env` names and only sent, never written. A reply's last
`Rating: N` / `Score: N` (pointwise) or `Verdict: A|B|tie` (pairwise) is parsed; a reply without
one is unparsable: counted, the first few logged (`rlhf.llm_judge`), dropped by the caller; a batch
with more than `max_unparsable` of them stops the run (JudgeServerError, exit 2). Before any model
loads, `check_server` probes the server: GET {url}/models must list the model (exit 2 otherwise).
"""

from __future__ import annotations

import json
import logging
import re
import string
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from rlhf.config import ConfigError
from rlhf.config.judge_template import Mode, load_template
from rlhf.config.llm_judge import LLMJudgeConfig
from rlhf.config.outside import outside_number
from rlhf.rl.remote_reward import JsonClient, bearer_token

log = logging.getLogger("rlhf.llm_judge")
Verdict = Literal["A", "B", "tie"]
LOGGED_REPLIES = 3  # unparsable replies shown in the log, per judge

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
SCORE_LINE = re.compile(rf"(?:rating|score)\**\s*[:=]\s*\**\s*\[*\s*({NUMBER})", re.IGNORECASE)
VERDICT_LINE = re.compile(r"verdict\**\s*[:=]\s*\**\s*\[*\s*(A|B|tie)\b", re.IGNORECASE)
WRAPPING = " \t\r\n*[]().'\"`"


class JudgeServerError(ConfigError):
    """The judge server is unreachable, answers outside the OpenAI schema, or its replies hold no
    score or verdict too often (exit code 2)."""


def render(template: str, **fields: str) -> str:
    """The template with its placeholders filled (a checked template: no attribute or index access)."""
    out = []
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if field is not None:
            out.append(fields[field])
    return "".join(out)


def parse_score(reply: str) -> float | None:
    """The last `Rating: N` / `Score: N` of a reply, else the reply if it is a number alone; None:
    unparsable. (A number float32 cannot hold is refused by the caller's check, not dropped.)"""
    found = SCORE_LINE.findall(reply)
    text = found[-1] if found else reply.strip(WRAPPING)
    return float(text) if re.fullmatch(NUMBER, text) else None


def parse_verdict(reply: str) -> Verdict | None:
    """The last `Verdict: A|B|tie` of a reply, else the reply if it is A, B or tie alone; None: unparsable."""
    found = VERDICT_LINE.findall(reply)
    text = (found[-1] if found else reply.strip(WRAPPING)).lower()
    return {"a": "A", "b": "B", "tie": "tie"}.get(text)  # type: ignore[return-value]


class LLMJudge:
    """The client of one judge server; `ask(contents)` -> each reply's text, in order."""

    def __init__(
        self,
        settings: LLMJudgeConfig,
        mode: Mode,
        *,
        key: str = "reward.llm_judge",
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.settings, self.mode, self.key = settings, mode, key
        self.template = load_template(settings.template, mode)
        base = settings.url.rstrip("/").removesuffix("/chat/completions")
        headers = {}
        if settings.key_env:
            token = bearer_token(
                settings.key_env,
                key=f"{key}.key_env",
                given="the API key of the judge server",
                flag="--judge-key-env",
                error=JudgeServerError,
                alone="as the provider gave it",
            )
            headers["Authorization"] = f"Bearer {token}"
        self.client = JsonClient(
            base,
            timeout=settings.timeout,
            retries=settings.retries,
            backoff=settings.backoff,
            headers=headers,
            server="the judge server",
            error=JudgeServerError,
            fix_down=f"start the server and check --judge-url (the OpenAI base URL, e.g. http://HOST:PORT/v1); "
            f"raise --{key}.timeout or --{key}.retries for a slow or busy server",
            fix_for=self._fix_for,
            timeout_key=f"{key}.timeout",
            wire="the OpenAI chat completions schema",
            sleep=sleep or time.sleep,
        )
        self.replies = 0  # replies read so far
        self.unparsable = 0  # of them, without a score or verdict
        self.example = ""  # the first unparsable reply

    def _fix_for(self, status: int) -> str:
        if status in (401, 403):
            if self.settings.key_env:
                return f"export {self.settings.key_env} with a key the server accepts"
            return "the server requires an API key: export it in a variable and pass --judge-key-env NAME"
        if status in (404, 405):
            return (
                "--judge-url must be the server's OpenAI base URL (ending in /v1 for vLLM, SGLang, llama.cpp, "
                "Ollama), the judge posts to URL/chat/completions"
            )
        if status in (400, 422):
            return (
                f"check --judge-model {self.settings.model!r} (the id GET URL/models lists) and the template"
            )
        return "check the server's log"

    def check_server(self) -> None:
        """Before any model loads: GET URL/models must list `model` (exit 2 naming the URL, the model
        and the ids served); a server without that path answers one chat completion of a token instead.
        A server that is down or answers outside the schema stops here, as the first request would."""
        listed = self.client.request("GET", "/models", absent=(404, 405, 501))
        if listed is None:  # no model list: the chat path itself must answer
            body = {"model": self.settings.model, "max_tokens": 1, "temperature": 0.0,
                    "messages": [{"role": "user", "content": "Reply with OK."}]}  # fmt: skip
            reply_text(self.client.request("POST", "/chat/completions", body), self.client.server)
            return
        served = model_ids(listed)
        if served is None:
            raise JudgeServerError(
                f"{self.client.server} answered GET /models with {json.dumps(listed)[:300]}, not a model list "
                '{"data": [{"id": "..."}]}. Fix: --judge-url must be an OpenAI-compatible server\'s base URL '
                "(e.g. http://HOST:PORT/v1; the judge posts to URL/chat/completions).",
                f"{self.key}.url",
            )
        model = self.settings.model
        if model not in served and f"{model}:latest" not in served:  # Ollama serves NAME as NAME:latest
            shown = ", ".join(served[:20]) + (f" (and {len(served) - 20} more)" if len(served) > 20 else "")
            raise JudgeServerError(
                f"--judge-model {model!r} is not served by {self.client.server}, which lists "
                f"{shown or 'no model'} (GET /models). Fix: --judge-model "
                f"{served[0] if served else 'NAME'} (an id it lists), or load {model} on the server.",
                f"{self.key}.model",
            )

    def ask(self, contents: Sequence[str]) -> list[str]:
        """Each content's reply text ("" when the server sent none), `concurrency` requests at a time."""
        workers = min(self.settings.concurrency, max(1, len(contents)))
        if workers == 1:
            return [self._ask_one(c) for c in contents]
        with ThreadPoolExecutor(workers, thread_name_prefix="llm-judge") as pool:
            return list(pool.map(self._ask_one, contents))

    def _ask_one(self, content: str) -> str:
        body = {
            "model": self.settings.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.settings.max_tokens,
            "temperature": self.settings.temperature,
        }
        return reply_text(self.client.request("POST", "/chat/completions", body), self.client.server)

    def scores(self, prompts: Sequence[str], responses: Sequence[str], where: str = "") -> list[float | None]:
        """Each response's score (None: unparsable), the batch's unparsable replies checked."""
        replies = self.ask([render(self.template, prompt=p, response=r) for p, r in zip(prompts, responses)])
        parsed = [parse_score(reply) for reply in replies]
        self.count(replies, parsed, where)
        said = f"{self.client.server} ({self.settings.model}) gave score"
        fix = "ask for a score on a sane scale in --judge-template (e.g. 1 to 10)"
        return [None if v is None else outside_number(v, said, fix, JudgeServerError) for v in parsed]

    def verdicts(
        self, prompts: Sequence[str], first: Sequence[str], second: Sequence[str], where: str = ""
    ) -> list[Verdict | None]:
        """Each pair's verdict, "A" for `first` (shown as response A), None: unparsable; checked."""
        contents = [
            render(self.template, prompt=p, response_a=a, response_b=b)
            for p, a, b in zip(prompts, first, second)
        ]
        replies = self.ask(contents)
        parsed = [parse_verdict(reply) for reply in replies]
        self.count(replies, parsed, where)
        return parsed

    def count(self, replies: Sequence[str], parsed: Sequence[object], where: str) -> None:
        """Count the unparsable replies, log the first few, stop when a batch holds too many."""
        bad = [reply for reply, value in zip(replies, parsed) if value is None]
        for reply in bad:
            if self.unparsable < LOGGED_REPLIES:
                log.warning(
                    "%sthe judge %s (%s) gave a reply without a %s (dropped): %s",
                    where,
                    self.client.server.removeprefix("the judge server "),
                    self.settings.model,
                    "score" if self.mode == "pointwise" else "verdict",
                    json.dumps(reply[:300]),
                )
            self.unparsable += 1
            self.example = self.example or reply
        self.replies += len(replies)
        share = len(bad) / len(replies) if replies else 0.0
        if share > self.settings.max_unparsable:
            wanted = "Rating: N" if self.mode == "pointwise" else "Verdict: A, B or tie"
            raise JudgeServerError(
                f"{where}{len(bad)} of {len(replies)} replies of {self.client.server} (model "
                f"{self.settings.model}) hold no {'score' if self.mode == 'pointwise' else 'verdict'}, more "
                f"than {self.key}.max_unparsable {self.settings.max_unparsable:g}; e.g. "
                f"{json.dumps(bad[0][:300])}. Fix: make --judge-template ask for '{wanted}' (docs/usage.md#llm-judge), "
                f"raise --{self.key}.max_tokens if replies are cut short, or use a model that follows the format.",
                f"{self.key}.max_unparsable",
            )


def model_ids(answer: object) -> list[str] | None:
    """The ids of a GET /models answer ({"data": [{"id": ...}, ...]}, the OpenAI schema); None
    when it has another shape."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        return None
    ids = [entry.get("id") for entry in data if isinstance(entry, dict)]
    named = [i for i in ids if isinstance(i, str)]
    return named if len(named) == len(data) else None


def reply_text(answer: object, server: str) -> str:
    """The first choice's message content of a chat completion ("" for a null content);
    JudgeServerError naming the server unless the answer has the schema's shape."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content", "") if isinstance(message, dict) else 0
    if content is None:
        return ""
    if not isinstance(content, str):
        raise JudgeServerError(
            f"{server} answered {json.dumps(answer)[:300]}, not a chat completion "
            '{"choices": [{"message": {"content": "..."}}]}. Fix: --judge-url must be an OpenAI-compatible '
            "server's base URL (the judge posts to URL/chat/completions)."
        )
    return content
