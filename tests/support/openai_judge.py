"""A loopback server speaking the OpenAI chat completions schema, as an LLM judge (vLLM, Ollama, a
hosted API) would: POST /v1/chat/completions -> {"choices": [{"message": {"content": REPLY}}]}, and
GET /v1/models -> {"data": [{"id": ...}]} of `models` (None: 404, a server without the list).
`reply(content) -> str` makes each reply from the request's user message; `failures` are answered
first, one per request, as (status, body bytes); every request's body (None for a GET) and headers
are recorded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def between(text: str, start: str, end: str | None = None) -> str:
    """The text of a built-in template's section (e.g. between "[Response A]\\n" and "\\n\\n[Response B]")."""
    tail = text.split(start, 1)[1]
    return tail.split(end, 1)[0] if end else tail


def length_rater(content: str) -> str:
    """Pointwise: "Rating: <words in the response>"."""
    response = between(content, "[Response]\n", "\n\nReply with")
    return f"Rating: {len(response.split())}"


def longer_wins(content: str) -> str:
    """Pairwise: the longer response wins (ties on equal length)."""
    a = between(content, "[Response A]\n", "\n\n[Response B]")
    b = between(content, "[Response B]\n", "\n\nReply with")
    return "Verdict: " + ("A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie")


class OpenAIJudge:
    def __init__(
        self,
        reply: Callable[[str], str] = length_rater,
        delay: float = 0.0,
        models: tuple[str, ...] | None = ("judge-7b", "m"),
    ) -> None:
        self.reply, self.delay, self.models = reply, delay, models
        self.failures: list[tuple[int, bytes]] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                    failure = judge.failures.pop(0) if judge.failures else None
                if judge.delay:
                    time.sleep(judge.delay)
                if failure is not None:
                    self.send(*failure)
                elif self.path != "/v1/chat/completions":
                    self.send(404, b'{"error": "not found"}')
                else:
                    content = body["messages"][-1]["content"]
                    answer = {
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": judge.reply(content)}}
                        ]
                    }
                    self.send(200, json.dumps(answer).encode())

            def do_GET(self) -> None:
                with judge.lock:
                    judge.requests.append({"path": self.path, "body": None, "headers": dict(self.headers)})
                    failure = judge.failures.pop(0) if judge.failures else None
                if failure is not None:
                    self.send(*failure)
                elif self.path != "/v1/models" or judge.models is None:
                    self.send(404, b'{"error": "not found"}')
                else:
                    listed = {"object": "list", "data": [{"id": m, "object": "model"} for m in judge.models]}
                    self.send(200, json.dumps(listed).encode())

            def send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a client that timed out hung up
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def contents(self) -> list[str]:
        return [r["body"]["messages"][-1]["content"] for r in self.requests if r["body"] is not None]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
