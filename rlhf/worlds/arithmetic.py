"""A built-in verifiable-reward task: addition word problems with an exact verifier (nothing downloaded).

    task = build_arithmetic(ArithmeticConfig(seed=0))
    task.write("runs/arith/task")     # tokenizer/, prompts_train.jsonl, prompts_test.jsonl, sft_train.jsonl
    task.correct(["7"], ["7"])        # [1.0]: the verifier (`--reward-fn rlhf.worlds.arithmetic:correct`)

A problem adds two numbers in 0..max_operand under one of a few templates; its answer, the sum, is one
token. The test problems are held-out phrasings of sums seen in training; `sft_train.jsonl` is right
with probability `sft_correct_rate`, so SFT teaches the format and a weak prior and the rest comes from
the reward (`ArithmeticConfig`; the pipeline and its measured gain: docs/verifiable_rewards.md)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from rlhf.models.tiny import word_tokenizer

TEMPLATES = (
    "{a} + {b} =",
    "what is {a} plus {b} ?",
    "add {a} and {b} :",
    "{name} has {a} apples and gets {b} more . how many apples ?",
    "{name} had {a} coins and found {b} . how many coins now ?",
    "the sum of {a} and {b} is",
)
NAMES = ("tom", "ana", "li", "sam", "eva", "omar", "kim", "noa")


@dataclass
class ArithmeticConfig:
    seed: int = 0  # seed of the held-out split, the names and the SFT answers
    max_operand: int = 9  # operands in 0..max_operand; answers in 0..2*max_operand (one token each)
    heldout_templates_per_pair: int = 1  # templates of each (a, b) pair kept for the test set
    names_per_problem: int = 3  # distinct names a template with {name} is written with (train and test)
    sft_examples: int = 2000  # warm-up examples (sft_train.jsonl)
    # share of warm-up answers that are right, the rest uniform at random: 0 teaches the format only
    sft_correct_rate: float = 0.5

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError(f"ArithmeticConfig.max_operand must be >= 1, got {self.max_operand}")
        if not 0 <= self.heldout_templates_per_pair < len(TEMPLATES):
            raise ValueError(
                f"ArithmeticConfig.heldout_templates_per_pair must be in 0..{len(TEMPLATES) - 1}, "
                f"got {self.heldout_templates_per_pair}"
            )
        if not 1 <= self.names_per_problem <= len(NAMES):
            raise ValueError(f"ArithmeticConfig.names_per_problem must be in 1..{len(NAMES)}")
        if not 0 <= self.sft_correct_rate <= 1:
            raise ValueError(
                f"ArithmeticConfig.sft_correct_rate must be in [0, 1], got {self.sft_correct_rate}"
            )


class ArithmeticTask:
    """Problems {"prompt", "answer"} split into train and test, the tokenizer, the verifier."""

    def __init__(self, config: ArithmeticConfig, train: list[dict], test: list[dict]):
        self.config, self.train, self.test = config, train, test
        numbers = [str(i) for i in range(2 * config.max_operand + 1)]
        words = {w for t in TEMPLATES for w in t.split() if not w.startswith("{")}
        self.tokenizer: PreTrainedTokenizerFast = word_tokenizer(
            [" ".join([*numbers, *NAMES, *sorted(words)])]
        )

    @property
    def answers(self) -> list[str]:
        """Every possible answer, as text."""
        return [str(i) for i in range(2 * self.config.max_operand + 1)]

    def sft_examples(self, n: int, rng: random.Random) -> list[dict]:
        """`n` warm-up examples on training prompts: the right answer with probability
        sft_correct_rate, else a uniformly random one of the answer range."""
        out = []
        for _ in range(n):
            problem = rng.choice(self.train)
            right = rng.random() < self.config.sft_correct_rate
            out.append(
                {
                    "prompt": problem["prompt"],
                    "response": problem["answer"] if right else rng.choice(self.answers),
                }
            )
        return out

    def write(self, directory: str | Path) -> Path:
        """The task's files (overwritten; the same config writes the same bytes)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(directory / "tokenizer"))
        files = {
            "prompts_train.jsonl": self.train,
            "prompts_test.jsonl": self.test,
            "sft_train.jsonl": self.sft_examples(
                self.config.sft_examples, random.Random(f"{self.config.seed}/sft")
            ),
        }
        for name, records in files.items():
            with open(directory / name, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        (directory / "arithmetic.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        return directory


def build_arithmetic(config: ArithmeticConfig | None = None) -> ArithmeticTask:
    """The task of `config` (default ArithmeticConfig()); deterministic given config.seed. Pair (a, b)
    holds out `heldout_templates_per_pair` consecutive templates starting at a rotating offset, so
    every template is held out for about as many pairs as the others."""
    config = config or ArithmeticConfig()
    rng = random.Random(f"{config.seed}/arithmetic")
    n, h = len(TEMPLATES), config.heldout_templates_per_pair
    train, test = [], []
    pairs = [(a, b) for a in range(config.max_operand + 1) for b in range(config.max_operand + 1)]
    start = rng.randrange(n)
    for k, (a, b) in enumerate(pairs):
        held = {(start + k * h + j) % n for j in range(h)}
        for t, template in enumerate(TEMPLATES):
            names = rng.sample(NAMES, config.names_per_problem) if "{name}" in template else [""]
            for name in names:
                problem = {"prompt": template.format(a=a, b=b, name=name), "answer": str(a + b)}
                (test if t in held else train).append(problem)
    return ArithmeticTask(config, train, test)


def parse_answer(response: str) -> int | None:
    """The integer a response states: its only word, if that is a number; else None."""
    words = response.split()
    if len(words) != 1:
        return None
    try:
        return int(words[0])
    except ValueError:
        return None


def answer_of(prompt: str) -> int:
    """The sum a prompt written by this task asks for (its two numbers added)."""
    numbers = [int(w) for w in prompt.split() if w.isdigit()]
    if len(numbers) != 2:
        raise ValueError(f"not an arithmetic task prompt (two numbers expected): {prompt!r}")
    return numbers[0] + numbers[1]


def correct(completions: Sequence[str], answer: Sequence[object], **kwargs) -> list[float]:
    """The exact verifier as a reward function: 1.0 where the response is exactly the answer (one
    integer, surrounding spaces ignored), else 0.0. `answer` is the prompt file's field."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions for {len(answer)} answers")
    out = []
    for response, expected in zip(completions, answer):
        stated = parse_answer(response)
        out.append(1.0 if stated is not None and stated == int(str(expected).strip()) else 0.0)
    return out
