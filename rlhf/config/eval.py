"""`rlhf eval`: two policies answer the same held-out prompts and a judge scores both.

Its groups use `rlhf train`'s names where they mean the same (`data.prompts`,
`data.max_prompt_tokens`, `rollout.max_new_tokens`, `rollout.sampling`, ...); the command's named
flags (`--prompts`, `--n`, `--max-new-tokens`, `--temperature`, ...) set them (rlhf/cli/eval.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlhf.config.checks import refuse, required, validate_groups
from rlhf.config.fields import ChatTemplate, Dtype, Sampling, SystemPrompt
from rlhf.config.keys import When, check_ranges, setting
from rlhf.config.llm_judge import LLMJudgeConfig
from rlhf.config.rollout import PAPER_SAMPLING

WITH_PAIRS = When("pairs", "set", says="--pairs FILE is given ({key})", fix="--pairs FILE")


@dataclass
class EvalDataConfig:
    prompts: str = ""  # held-out prompts file (--prompts)
    n: int = setting(256, ">= 1", unit="prompts")  # prompts to evaluate: the first N (--n)
    # prompt budget in tokens, oldest dialogue turns dropped first (--max-prompt-tokens); None: the
    # --policy run's data.max_prompt_tokens from its config.yaml, else 512
    max_prompt_tokens: int | None = setting(None, ">= 1", unit="tokens")
    skip_invalid: bool = False  # skip malformed prompt lines (counted) instead of stopping (--skip-invalid)
    # render HH dialogues and messages with the policy tokenizer's chat template and stop at its
    # end-of-turn token (--chat-template; fields.ChatTemplate)
    chat_template: ChatTemplate = "auto"
    # the template's default system prompt (fields.SystemPrompt); None: the --policy run's
    # data.system_prompt from its config.yaml, else "template"
    system_prompt: SystemPrompt | None = None
    # held-out preference pairs: the judge-free verdict from human labels, eval.json's "pairs"
    # (--pairs; docs/algorithms.md §38); with no --prompts, the only figures
    pairs: str = ""
    # the first N valid pairs; None: every one (--pairs-n)
    pairs_n: int | None = setting(None, ">= 1", when=WITH_PAIRS)
    pairs_batch_size: int = setting(8, ">= 1", when=WITH_PAIRS)  # pairs per forward of the verdict
    # response budget of the pairs in tokens (longer ones right-truncated, EOS kept); None: the --policy
    # run's data.max_response_tokens from its config.yaml, else the --baseline run's, else 512
    max_response_tokens: int | None = setting(None, ">= 1", unit="tokens", when=WITH_PAIRS)


@dataclass
class EvalRolloutConfig:
    max_new_tokens: int = setting(64, ">= 1", unit="tokens")  # response budget (--max-new-tokens)
    # sampling temperature; 0: greedy, the most likely answer (--temperature)
    temperature: float = setting(1.0, "[0, 10]", why="above 10 every token is about equally likely")
    top_p: float = setting(1.0, "(0, 1]")  # nucleus sampling (--top-p)
    # "custom": the two fields above | "paper": the PPO paper §6.1 sampling, temperature 0.8, top-p 0.9,
    # repetition penalty 1.1 (--sampling)
    sampling: Sampling = "custom"

    def validate(self, prefix: str) -> None:
        if self.sampling == "paper" and (self.temperature, self.top_p) != (1.0, 1.0):
            refuse(
                f"{prefix}sampling paper sets temperature {PAPER_SAMPLING['temperature']}, top-p "
                f"{PAPER_SAMPLING['top_p']} and repetition penalty {PAPER_SAMPLING['repetition_penalty']}, but "
                f"{prefix}temperature is {self.temperature!r} and {prefix}top_p {self.top_p!r}. Fix: drop "
                f"--{prefix}temperature/--{prefix}top_p, or drop --{prefix}sampling paper.",
                f"{prefix}sampling",
            )


@dataclass
class EvalConfig:
    policy: str = ""  # policy directory to evaluate (--policy)
    gguf_file: str | None = None  # GGUF file name inside `policy` (loads dequantized; --gguf_file)
    # policy directory to compare against (--baseline); "": none, with --reward-fn alone (accuracy on
    # a verifiable task: each function's mean with its interval, eval.json's "reward_functions")
    baseline: str = ""
    baseline_gguf_file: str | None = None  # GGUF file name inside `baseline` (--baseline_gguf_file)
    judge: str = ""  # reward-model directory, or "world:DIR" for a built-in world's gold reward (--judge)
    # further judges (--judge repeated): the same answers scored by each; eval.json's "judges" holds
    # every judge's figures, its top level the first judge's
    extra_judges: list[str] = field(default_factory=list)
    # Python reward functions, "module:function" or {name, weight}, added to the judge's score
    # (--reward-fn, repeatable; docs/algorithms.md §31)
    reward_functions: list[Any] = field(default_factory=list)
    # an LLM judge over HTTP: each pair of answers judged twice, positions swapped (--judge-url;
    # eval.json's "llm_judge", docs/algorithms.md §33)
    llm_judge: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)
    out: str = ""  # where eval.json is written; "": in the --policy directory (--out)
    seed: int = setting(0, "any", why="every integer seeds the generators")  # sampling seed (--seed)
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N" (--device)
    dtype: Dtype = "auto"  # precision of every model (fields.Dtype; --dtype)
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    rollout: EvalRolloutConfig = field(default_factory=EvalRolloutConfig)

    def validate(self, prefix: str = "") -> None:
        check_ranges(self, prefix)
        required(self.policy, f"{prefix}policy", "--policy DIR (or policy: in --config)")
        if not (self.reward_functions and self.data.prompts):  # --reward-fn alone needs no baseline
            required(
                self.baseline,
                f"{prefix}baseline",
                "--baseline DIR (or baseline: in --config); --prompts FILE with --reward-fn MODULE:FN "
                "alone needs none",
            )
        if not self.data.pairs:  # --pairs alone is a complete evaluation (the label verdict)
            required(
                self.data.prompts,
                f"{prefix}data.prompts",
                "--prompts FILE (win rates under a judge) and/or --pairs FILE (the verdict of held-out "
                "human labels)",
            )
        validate_groups(self, prefix)
        llm = self.llm_judge.url
        if not self.data.prompts and (self.judge or self.reward_functions or llm):
            refuse(
                "--judge / --judge-url / --reward-fn score the answers to --prompts, and no --prompts is given "
                "(--pairs needs no judge). Fix: add --prompts FILE, or drop --judge, --judge-url and --reward-fn.",
                "judge",
            )
        if not self.baseline and (self.judge or self.data.pairs or llm):
            flag = "--judge" if self.judge else "--judge-url" if llm else "--pairs"
            refuse(
                f"{flag} compares the policy with a --baseline, and no --baseline is given. Fix: add --baseline "
                f"DIR, or drop {flag} to score the answers with --reward-fn alone.",
                f"{prefix}baseline",
            )
        if self.data.prompts and not (self.judge or self.reward_functions or llm):
            refuse(
                "--judge is missing (and no --judge-url or --reward-fn is given): nothing would score the "
                "responses. Fix: --judge RM_DIR (or world:DIR), --judge-url URL, and/or --reward-fn module:function.",
                "judge",
            )
