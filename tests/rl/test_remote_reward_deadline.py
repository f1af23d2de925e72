"""`--reward-url`'s HTTP client (rlhf/rl/remote_reward.py): `reward.remote.timeout` bounds each
attempt whole (connect, send, every read), so a server that trickles its answer a byte at a time
times out like one that never answers, with the retries as before; and every score a server answers
goes through the one check of outside numbers (1e39 and 10**400 are beyond float32: exit 2 naming
the URL and the value)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rlhf.config.remote import RemoteRewardConfig
from rlhf.models.tiny import word_tokenizer
from rlhf.rl.remote_reward import RemoteReward, RewardServerError, check_scores


class Trickler:
    """A loopback server that reads each request, sends `head` at once, then `answer` one byte every
    `pause` seconds (stops when the client hangs up or after `limit` seconds)."""

    def __init__(self, answer: bytes, pause: float = 0.05, limit: float = 10.0, head: bytes = b""):
        self.answer, self.pause, self.limit, self.head = answer, pause, limit, head
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(1.0)
            try:
                connection.recv(65536)
                connection.sendall(self.head)
                end = time.monotonic() + self.limit
                for byte in self.answer:
                    if self.closed.is_set() or time.monotonic() > end:
                        return
                    connection.sendall(bytes([byte]))
                    time.sleep(self.pause)
            except OSError:  # the client hung up: its deadline passed
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


BODY = b'{"status": "ok", "wire": 1, "tokenizer": null, "padding": "' + b"x" * 200 + b'"}'
SLOW_BODY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
)
SLOW_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: y\r\n" * 40 + b"Content-Length: 2\r\n\r\n{}"
# an HTTP/1.0 answer (as Python's http.server gives) closes its connection: http.client hands the
# socket over to the response, whose body is then read after connection.sock is gone
CLOSING_HEAD = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY)


def client(url: str, **settings) -> RemoteReward:
    sleeps: list[float] = []
    return RemoteReward(RemoteRewardConfig(url=url, **settings), word_tokenizer(["a b"]), sleep=sleeps.append)


@pytest.mark.parametrize(
    ("head", "answer"), [(b"", SLOW_BODY), (b"", SLOW_HEADERS), (CLOSING_HEAD, BODY)],
    ids=["body", "headers", "headers-at-once-then-body-of-a-closing-answer"],
)  # fmt: skip
def test_a_server_trickling_its_answer_times_out_within_the_deadline(head, answer):
    server = Trickler(answer, head=head)  # 0.05 s a byte: each read is quick, the whole answer takes > 10 s
    try:
        start = time.monotonic()
        with pytest.raises(RewardServerError) as raised:
            client(server.url, timeout=0.4, retries=1, backoff=0.0).health()
        elapsed = time.monotonic() - start
    finally:
        server.close()
    assert "after 2 attempts (no answer within reward.remote.timeout 0.4 s)" in str(raised.value)
    assert server.accepted == 2  # retried, as any timeout is
    assert elapsed < 5.0  # two attempts of 0.4 s; a per-read timeout would wait for the whole answer


def test_an_answer_within_the_deadline_is_read_whole():
    server = Trickler(SLOW_BODY, pause=0.0)
    try:
        assert client(server.url, timeout=5.0, retries=0).health()["padding"] == "x" * 200
    finally:
        server.close()


@pytest.mark.parametrize(
    ("scores", "said"),
    [
        ([1.0, 1e39], "answered score 1e+39 for response 1 of 2, beyond float32"),
        ([-1e39, 0.0], "answered score -1e+39 for response 0 of 2, beyond float32"),
        ([10**400, 0], "(an integer of 401 digits) for response 0 of 2, beyond float32"),
        ([0.5, True], "answered score True for response 1 of 2, not a number (bool)"),
        ([float("inf"), 0.0], "answered score inf for response 0 of 2, not a finite number"),
    ],
)
def test_a_score_float32_cannot_hold_is_refused_naming_the_url(scores, said):
    with pytest.raises(RewardServerError) as raised:
        check_scores({"scores": scores}, 2, "http://rm:8000")
    assert said in str(raised.value) and "http://rm:8000" in str(raised.value) and "Fix:" in str(raised.value)


def test_an_answer_repeating_a_key_is_not_taken():
    with pytest.raises(RewardServerError, match=r"key 'scores' is given twice"):
        client("http://127.0.0.1:9").client._json(b'{"scores": [1.0], "scores": [2.0]}', "POST", "/score")
