"""Configuration: one dataclass per stage, YAML presets, dotted command-line overrides.

Layering (later wins): stage defaults < preset YAML < user YAML (`--config`) < `--a.b value` flags.
Each layer changes only the keys it names, at any depth; every other field keeps its stage default,
which for a nested group is the parent field's `default_factory` result (SFT's optimizer defaults
are not RL's), not the group class's own defaults.
Unknown keys are errors that name the key, where it came from and the nearest valid key.
Every PPO trick of the PPO paper (sec. 5.3) is its own field, independent of the others.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlhf.core.advantages import ESTIMATORS, estimator_spec
from rlhf.core.losses import POLICY_LOSSES

PRESET_DIR = Path(__file__).parent / "presets"
MIN_USEFUL_TEMPERATURE = 0.05  # below it the sampled tokens' probabilities are ~1: ~0 policy gradient
_config_logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A user-facing configuration mistake (bad key, bad value, bad file)."""


# ---------------------------------------------------------------------------------------------
# Shared groups
# ---------------------------------------------------------------------------------------------
@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters instead of all weights (PEFT)
    r: int = 8  # adapter rank
    alpha: int = 16  # adapter scaling numerator
    dropout: float = 0.0  # adapter dropout (keep 0 for an exact first PPO ratio)
    target_modules: list[str] | None = (
        None  # None: PEFT's default for the architecture (Llama: q_proj, v_proj)
    )


@dataclass
class OptimConfig:
    lr: float = 1e-5  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas (PPO paper, OpenRLHF)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup_steps: int = 0  # linear warmup steps from 0 to lr
    # warmup over this fraction of the optimizer steps (PPO paper sec. 5.1: 0.1); the longer of the two wins
    warmup_fraction: float = 0.0
    schedule: str = "constant"  # "constant" | "cosine" | "linear" decay after warmup
    min_lr_ratio: float = 0.0  # floor of the cosine/linear decay, as a fraction of lr
    max_grad_norm: float | None = 1.0  # global gradient-norm clipping (PPO paper 5.4, C.2); None: off


@dataclass
class DistConfig:
    """Data parallelism over the processes torchrun starts (docs/distributed.md). Batch sizes stay
    global: the same config gives the same numbers on 1 or N processes."""

    # none: one process | ddp: every rank holds the whole model and its share of each batch's rows;
    # the gradients are summed over the ranks before each optimizer step | fsdp2: as ddp, the trained
    # models' parameters and optimizer state sharded over the ranks between uses (docs/distributed.md)
    strategy: str = "none"
    timeout: float = 600.0  # seconds a collective waits for the other ranks before the job ends


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------
@dataclass
class SFTDataConfig:
    path: str = ""  # SFT data: prompt/response, prompt/completion or chat messages (.jsonl/.json/.parquet)
    format: str = "auto"  # "auto" | "sft" | "messages"
    test_fraction: float = 0.05  # held out for evaluation loss and perplexity
    max_prompt_tokens: int = 256  # longer prompts drop their oldest turns, then left-truncate
    max_response_tokens: int = 256  # longer responses right-truncate (EOS kept)
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    # "auto": render HH dialogues and messages with the tokenizer's chat template when it has one
    # (responses then end with its end-of-turn token) | true: require one | false: verbatim text
    chat_template: str | bool = "auto"


@dataclass
class SFTTrainConfig:
    epochs: float = 1.0  # passes over the training data (fractional allowed)
    max_steps: int | None = None  # stop after this many optimizer steps (overrides epochs)
    batch_size: int = 16  # examples per optimizer step
    micro_batch_size: int = 8  # examples per forward/backward (gradient accumulation)
    # less padding (docs/padding.md): "within_step" sorts each step's rows by length before cutting
    # micro-batches (the same step gradient, to float rounding) | "across_steps" also makes steps of
    # similar-length rows (HF group_by_length: another random order) | "none"
    group_by_length: str = "within_step"
    eval_every: int = 100  # evaluate every N steps (and at the end)
    log_every: int = 10  # write metrics every N steps
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"


@dataclass
class SFTConfig:
    model: str = ""  # base model: a save_pretrained directory, a hub id (online) or a GGUF directory
    gguf_file: str | None = None  # GGUF file name inside `model` (loads through transformers)
    out: str = "runs/sft"  # run directory
    seed: int = 0  # seed of data order and initialization
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-5, warmup_steps=10, schedule="cosine")
    )
    lora: LoraConfig = field(default_factory=LoraConfig)
    # "auto" (bfloat16 on a CUDA GPU, float32 on the CPU) | "float32" | "bfloat16" (autocast over float32
    # weights) | "bfloat16-pure" (bfloat16 weights and optimizer state: half the memory); precision.py
    dtype: str = "auto"
    # recompute each decoder layer in the backward: activations of one layer kept instead of all
    gradient_checkpointing: bool = False
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun: data-parallel ranks


# ---------------------------------------------------------------------------------------------
# Reward model
# ---------------------------------------------------------------------------------------------
@dataclass
class RewardDataConfig:
    path: str = ""  # preference pairs: prompt/chosen/rejected, HH-RLHF dialogues, or chat messages
    format: str = "auto"  # "auto" | "pairs" | "hh" | "messages"
    test_fraction: float = 0.05  # held out for accuracy and margins
    max_prompt_tokens: int = 256  # prompt budget (oldest turns dropped first)
    max_response_tokens: int = 256  # response budget
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    # "auto": render HH dialogues and messages with the tokenizer's chat template when it has one
    # (responses then end with its end-of-turn token) | true: require one | false: verbatim text
    chat_template: str | bool = "auto"


@dataclass
class RewardTrainConfig:
    epochs: float = 1.0  # passes over the pairs (PPO paper: about one)
    max_steps: int | None = None  # stop after this many optimizer steps
    batching: str = (
        "pairs"  # "pairs": fixed pairs per step | "tokens": about max_tokens per step (PPO paper sec. 4)
    )
    batch_size: int = 16  # pairs per step when batching == "pairs"
    max_tokens: int = 8192  # tokens per step when batching == "tokens"
    # pairs per step when batching == "tokens" (PPO paper sec. 4.2: at least 4, at most 128); the
    # minimum wins over max_tokens for long pairs
    min_batch: int = 4
    max_batch: int = 128
    micro_batch_size: int = 8  # pairs per forward/backward
    # less padding (docs/padding.md): "within_step" | "across_steps" | "none", as SFTTrainConfig's
    # (with batching "tokens" the steps already hold pairs of similar length)
    group_by_length: str = "within_step"
    lm_coef: float = (
        1.0  # beta_rm: weight of the LM imitation loss on the chosen response (paper 1, its code 0)
    )
    eval_every: int = 100  # evaluate on the held-out pairs every N steps; the best checkpoint is kept
    log_every: int = 10  # write metrics every N steps
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"


@dataclass
class RewardConfig:
    model: str = ""  # initialization: usually the SFT run directory
    gguf_file: str | None = None  # GGUF file name inside `model`
    out: str = "runs/rm"  # run directory; the best checkpoint (by held-out accuracy) lands in it
    seed: int = 0  # seed of data order and head initialization
    data: RewardDataConfig = field(default_factory=RewardDataConfig)
    train: RewardTrainConfig = field(default_factory=RewardTrainConfig)
    optim: OptimConfig = field(
        # PPO paper sec. 4.2: lr 5e-6, warmup over the first 10% of the steps
        default_factory=lambda: OptimConfig(lr=5e-6, warmup_fraction=0.1, schedule="cosine")
    )
    lora: LoraConfig = field(default_factory=LoraConfig)
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "bfloat16-pure", as SFTConfig.dtype
    gradient_checkpointing: bool = False  # recompute each decoder layer in the backward: less memory
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun: data-parallel ranks


# ---------------------------------------------------------------------------------------------
# RL (PPO, PPO-max, APA, AWR)
# ---------------------------------------------------------------------------------------------
@dataclass
class RLModelConfig:
    policy: str = ""  # the SFT model directory (also the frozen reference)
    gguf_file: str | None = None  # GGUF file name inside `policy`
    reward_model: str = ""  # reward-model directory (ScalarHeadModel)
    critic_init: str = (
        "reward_model"  # "reward_model" (PPO paper sec. 5.3.3) | "policy" (SFT trunk, fresh head)
    )
    critic_mode: str = "separate"  # "separate" critic network | "shared": value head on the policy trunk
    value_coef: float = 0.5  # weight of the value loss when critic_mode == "shared"
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA policy; the reference is the adapter disabled
    critic_lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA on the separate critic's trunk
    # precision of every role: "auto" (bfloat16 on a CUDA GPU, float32 on the CPU) | "float32" |
    # "bfloat16" (autocast over float32 weights) | "bfloat16-pure" (bfloat16 weights); precision.py
    dtype: str = "auto"
    gradient_checkpointing: bool = False  # trained roles recompute each decoder layer in the backward


@dataclass
class RLDataConfig:
    prompts: str = ""  # prompts file (any format with a prompt); preference/SFT files work too
    format: str = "auto"  # "auto" | "prompt" | "sft" | "pairs" | "hh" | "messages"
    max_prompt_tokens: int = 256  # prompt budget (oldest turns dropped first, then left-truncated)
    ptx: str | None = None  # SFT data for the PPO-ptx loss (InstructGPT); None: no ptx loss
    ptx_batch_size: int = 8  # SFT examples per ptx step
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    # "auto": render HH dialogues and messages with the tokenizer's chat template when it has one
    # (responses then end with its end-of-turn token) | true: require one | false: verbatim text
    chat_template: str | bool = "auto"


@dataclass
class RolloutConfig:
    batch_size: int = 64  # prompts sampled per iteration
    # responses sampled per prompt (a group); the rollout holds batch_size * samples_per_prompt rows
    samples_per_prompt: int = 1
    max_new_tokens: int = 64  # response budget; responses without EOS are "truncated"
    # "custom": the three fields below | "paper": the PPO paper's sec. 6.1 sampling, temperature 0.8,
    # top-p 0.9, repetition penalty 1.1 (SamplingConfig.ppo_paper); naming one of them too is an error
    sampling: str = "custom"
    temperature: float = 1.0  # sampling temperature (log-probs use the same temperature)
    top_p: float = 1.0  # nucleus sampling (PPO paper: 0.9)
    top_k: int = 0  # top-k sampling; 0: off
    repetition_penalty: float = 1.0  # CTRL-style penalty (PPO paper: 1.1); 1.0: off
    stop_at_eos: bool = True  # end each response at its EOS (False: always max_new_tokens, for benchmarks)
    # rows that ended leave the sampler's batch (cheaper steps as a mixed-length batch drains; same tokens)
    drop_finished_rows: bool = True
    # old log-probs from the sampler's own logits (as TRL does) instead of one more policy forward:
    # saves a forward per iteration; the first PPO ratio is then 1 only to float rounding (~1e-6 fp32)
    logprobs_from_sampler: bool = False
    truncated: str = "keep"  # responses that hit max_new_tokens: "keep" | "penalize" | "drop"
    truncation_penalty: float = -1.0  # score given to truncated responses when truncated == "penalize"


@dataclass
class RewardProcessingConfig:
    scale: bool = False  # reward scaling: divide by the running std (PPO paper sec. 5.3.1)
    normalize: bool = False  # reward normalization: subtract running mean, divide by running std
    clip: float | None = None  # reward clipping to [-clip, clip] after scaling/normalization
    discounted: bool = False  # scaling uses the std of discounted returns (Engstrom et al.); needs scale
    discount_gamma: float = 0.99  # discount of the running return when discounted is on (< 1)
    # Python reward functions, "module:function" or {name: "module:function", weight: 1.0}, added to the
    # reward model's score (docs/algorithms.md#31-reward-functions); none imported unless named here
    functions: list[Any] = field(default_factory=list)
    model_weight: float = 1.0  # weight of the reward model's score in the sum (with reward functions)


@dataclass
class KLConfig:
    beta: float = 0.05  # token-level KL penalty coefficient in the reward (PPO paper 0.05); 0: off
    estimator: str = "k1"  # "k1" | "k2" | "k3" (docs/algorithms.md#7-kl-estimators)
    adaptive: bool = False  # Ziegler et al. adaptive controller instead of a fixed beta
    target: float = 6.0  # adaptive target of the summed per-response KL
    horizon: int = 10000  # adaptive controller horizon, in samples


@dataclass
class AdvantageConfig:
    # "gae" (critic) | "grpo" | "dr_grpo" | "rloo" (groups, no critic) | "reinforce_pp" (no critic);
    # any estimator registered in rlhf.core.advantages (docs/algorithms.md#27-critic-free-advantage-estimators)
    estimator: str = "gae"
    gamma: float = 1.0  # discount
    lam: float = 0.95  # GAE lambda
    whiten: bool = True  # advantage normalization per minibatch (PPO paper sec. 5.3.1)
    clip: float | None = None  # clip whitened advantages to [-clip, clip] (paper tries 0.12, 0.5, 0.8)
    group_eps: float = 1e-6  # grpo: added to the group std before dividing
    std_normalize: bool = True  # grpo: divide by the group std (false: the mean-centred reward only)


@dataclass
class PolicyLossConfig:
    loss: str = "ppo"  # "ppo" | "apa" | "awr" | any loss registered in rlhf.core.losses
    clip_eps: float = 0.2  # PPO ratio clip
    dual_clip: float | None = None  # dual-clip constant c > 1 for negative advantages; None: off
    ratio_against: str = "old"  # importance-sampling denominator: "old" (behaviour) | "ref" (PPO paper 5.3.2)
    apa_lam: float = 0.1  # APA lambda (= 1/c_sq of the APA code, which uses c_sq = 10)
    awr_lam: float = 2.0  # AWR temperature (the APA code's c_log = 1/lam = 0.5)
    awr_max_weight: float | None = 20.0  # AWR weight clip; None: off
    entropy_coef: float = 0.0  # entropy bonus (PPO paper sec. 5.3.2: sensitive, off by default)
    # with a target: the term is entropy_coef * max(|H - target| - entropy_clip, 0) instead of -entropy_coef * H,
    # pulling the token-mean entropy H (nats) into a region around the target (appendix B.3); None: plain bonus
    entropy_target: float | None = None
    entropy_clip: float = 0.0  # half-width of that region (0: the authors' code's |H - target|)
    ptx_coef: float = 0.0  # PPO-ptx: weight of the SFT loss on data.ptx (needs data.ptx)
    kl_loss_coef: float = 0.0  # KL(pi || pi_ref) added to the loss per token (GRPO eq. 3: 0.04); 0: off
    kl_loss_estimator: str = "k3"  # estimator of the KL in the loss: "k1" | "k2" | "k3" (GRPO: k3)
    # "token_mean": loss / valid tokens | "fixed_length": loss / (rows * rollout.max_new_tokens) (Dr. GRPO)
    loss_aggregation: str = "token_mean"


@dataclass
class CriticConfig:
    value_clip: float | None = 0.2  # clipped value loss (docs/algorithms.md#15-value-loss); None: unclipped
    pretrain_iterations: int = 0  # value-only iterations before policy updates (PPO paper sec. 5.3.3)
    pretrain_patience: int = 3  # stop pre-training after this many iterations without improvement
    pretrain_min_delta: float = 0.01  # relative value-loss improvement that counts


@dataclass
class RLTrainConfig:
    iterations: int = 100  # rollout + update cycles
    ppo_epochs: int = 1  # passes over each rollout batch (PPO paper 1, APA paper 2)
    minibatches: int = 1  # optimizer steps per epoch (the rollout batch is split into this many)
    micro_batch_size: int = 16  # rows per forward/backward (token-weighted gradient accumulation)
    buffer_size: int = 1  # rollout batches kept and reused (experience buffer, PPO paper sec. 5.3.2)
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"


@dataclass
class RuntimeConfig:
    """How the roles' work is scheduled on the machine: none of these changes the algorithm (same
    result to float rounding, each tested so), only its speed and memory (rlhf/runtime/)."""

    # CPU, separate critic: the critic's optimizer steps run on a second thread beside the policy's
    # (they share no parameter); the intra-op threads are split between the two sides
    overlap_critic: bool = True
    # score/reference/value forwards on a multi-core CPU: the two halves of the rows side by side,
    # one core each (cores kept on whole products; same result to float rounding, reproducible)
    split_forwards: bool = True
    # glibc: keep freed memory for reuse instead of returning it to the OS after every step (no page
    # faults on the next step's activations; the resident set stays near its peak). allocator.py
    keep_freed_memory: bool = True
    # CPU sampling through oneDNN-prepacked copies of the linear weights, made per rollout (faster decode
    # steps, same tokens up to float rounding; the copies take the linear weights' size while sampling)
    pack_weights: bool = True
    # rows of similar length share a micro-batch in the rollout's forwards and the update (sorted
    # by length inside the rollout batch / minibatch, results put back in order): less padding,
    # the same results to float rounding (rlhf.data.length_grouping, docs/padding.md)
    sort_by_length: bool = True


@dataclass
class CollapseConfig:
    kl_rise: float | None = 3.0  # KL to the reference reaches this multiple of its early baseline
    kl_floor: float = 0.5  # the KL baseline counts as at least this (nats per response)
    ppl_drop: float | None = 0.25  # policy perplexity on its own responses falls by this fraction
    length_drift: float | None = 0.3  # mean response length moves (up or down) by this fraction
    diversity_drop: float | None = 0.4  # or distinct-2 of the responses falls by this fraction
    window: int = 5  # iterations in the rolling median of each signal
    baseline_steps: int = 5  # first iterations whose median is the baseline
    patience: int = 3  # consecutive iterations the whole signature must hold before a warning


@dataclass
class LogConfig:
    every: int = 1  # write metrics every N iterations
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    stop_on_collapse: bool = False  # stop the run when the collapse detector fires
    collapse: CollapseConfig = field(default_factory=CollapseConfig)  # PPO paper sec. 5.2 signature
    eval_every: int = 0  # evaluate on held-out prompts every N iterations; 0: off
    samples_to_log: int = 4  # responses kept per evaluation in samples.jsonl


@dataclass
class CheckpointConfig:
    every: int = 0  # save a resumable checkpoint every N iterations (and at the end); 0: end only
    keep: int = 2  # checkpoints kept (older ones removed)


@dataclass
class RLConfig:
    out: str = "runs/rl"  # run directory
    seed: int = 0  # seed of sampling, shuffling and head initialization
    preset: str | None = None  # the preset this config started from (informational)
    model: RLModelConfig = field(default_factory=RLModelConfig)
    data: RLDataConfig = field(default_factory=RLDataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardProcessingConfig = field(default_factory=RewardProcessingConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: RLTrainConfig = field(default_factory=RLTrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun: data-parallel ranks
    policy_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    critic_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-6))
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @property
    def uses_critic(self) -> bool:
        """The advantage estimator reads a critic's values (gae); the others train no critic."""
        return estimator_spec(self.advantage.estimator).needs_values


# Keys that configure the critic: with an estimator that needs no critic, a user layer naming one is
# an error (the setting would silently do nothing).
CRITIC_KEYS = (
    "model.critic_init",
    "model.critic_mode",
    "model.value_coef",
    "model.critic_lora",
    "critic",
    "critic_optim",
)

PRESETS = ("vanilla_ppo", "ppo_max", "apa", "awr", "grpo", "rloo", "reinforce_pp")

CHOICES = {
    "kl.estimator": ("k1", "k2", "k3"),
    "advantage.estimator": ESTIMATORS.keys(),  # the estimator registry's names, live
    "policy.kl_loss_estimator": ("k1", "k2", "k3"),
    "policy.loss_aggregation": ("token_mean", "fixed_length"),
    "policy.loss": POLICY_LOSSES.keys(),  # the loss registry's names, live: losses registered later count
    "policy.ratio_against": ("old", "ref"),
    "model.critic_init": ("reward_model", "policy"),
    "model.critic_mode": ("separate", "shared"),
    "rollout.truncated": ("keep", "penalize", "drop"),
    "rollout.sampling": ("custom", "paper"),
    "optim.schedule": ("constant", "cosine", "linear"),
    "train.batching": ("pairs", "tokens"),
    "train.group_by_length": ("none", "within_step", "across_steps"),  # rlhf.data.length_grouping
    "dtype": ("auto", "float32", "bfloat16", "bfloat16-pure"),  # also model.dtype (rlhf.models.precision)
    "data.chat_template": ("auto", True, False),
    "dist.strategy": ("none", "ddp", "fsdp2"),
}


# ---------------------------------------------------------------------------------------------
# Building, validating, layering
# ---------------------------------------------------------------------------------------------
def preset_dict(name: str) -> dict:
    """The YAML mapping of a shipped preset."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown preset {name!r}. Fix: use one of {', '.join(PRESETS)}.")
    return _read_yaml(path)


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found. Fix: check the path.") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}.")
    return data


def parse_overrides(args: list[str]) -> dict:
    """`["--kl.beta", "0.05", "--train.iterations=20"]` -> nested dict; values parsed as YAML scalars."""
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}. Fix: overrides look like --group.key value.")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"--{key} needs a value. Fix: --{key} VALUE.")
            raw = args[i + 1]
            i += 2
        key = key.replace("-", "_")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads "1e-3" (no dot) as a string
            except ValueError:
                pass
        if isinstance(value, str) and raw.strip() == "":
            value = ""
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--{key}: {part} is set both as a value and as a group.")
        node[parts[-1]] = value
    return out


def deep_merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def from_dict(cls: type, data: dict, *, origin: str = "config", prefix: str = "", base: Any = None):
    """`base` (default: `cls()`, the stage defaults) with the keys `data` names replaced, keys and
    types checked. A nested group named in `data` is rebuilt over `base`'s own value of that group
    (e.g. RLConfig's `policy_optim` with lr 1e-6), so only the keys named at any depth change."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: {prefix.rstrip('.') or 'the config'} must be a mapping, got {data!r}.")
    base = cls() if base is None else copy.deepcopy(base)  # never share lists with the caller's base
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    changes = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(cls, key, dotted, origin, prefix))
        if dataclasses.is_dataclass(hints[key]):
            changes[key] = from_dict(
                hints[key], value, origin=origin, prefix=f"{dotted}.", base=getattr(base, key)
            )
        else:
            changes[key] = _coerce(hints[key], value, dotted, origin)
    return dataclasses.replace(base, **changes)


# Keys that moved to another group: old config files (a run's config.yaml, on resume) still load,
# and an old flag names its new spelling.
MOVED_KEYS = {
    "train.overlap_critic": "runtime.overlap_critic",
    "train.keep_freed_memory": "runtime.keep_freed_memory",
    "rollout.split_forwards": "runtime.split_forwards",
    "rollout.pack_weights": "runtime.pack_weights",
}


def migrate_moved_keys(data: dict) -> dict:
    """`data` with every key of MOVED_KEYS under its new name (a later value at the new name wins)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for old, new in MOVED_KEYS.items():
        old_group, old_key = old.split(".")
        new_group, new_key = new.split(".")
        group = out.get(old_group)
        if isinstance(group, dict) and old_key in group:
            value = group.pop(old_key)
            target = out.setdefault(new_group, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
    return out


def _unknown_key_message(cls: type, key: str, dotted: str, origin: str, prefix: str) -> str:
    if dotted in MOVED_KEYS:
        return f"{origin}: {dotted!r} is now {MOVED_KEYS[dotted]!r}. Fix: --{MOVED_KEYS[dotted]} (or that key in YAML)."
    valid = [f"{prefix}{f.name}" for f in dataclasses.fields(cls)]
    everywhere = _all_keys(cls, prefix)
    close = difflib.get_close_matches(dotted, everywhere, n=1, cutoff=0.5) or difflib.get_close_matches(
        key, [k.rsplit(".", 1)[-1] for k in everywhere], n=1, cutoff=0.5
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{origin}: unknown key {dotted!r}.{hint} Valid keys here: {', '.join(valid)}."


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(_all_keys(hints[f.name], f"{prefix}{f.name}."))
    return keys


def _coerce(tp: Any, value: Any, key: str, origin: str):
    def bad(expected: str):
        return ConfigError(f"{origin}: {key} must be {expected}, got {value!r}.")

    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if isinstance(value, bool) and bool in inner:  # e.g. `str | bool`: "auto" or true/false
            return value
        return _coerce(inner[0], value, key, origin)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad("a string")
        choices = next((c for k, c in CHOICES.items() if key == k or key.endswith(("." + k, "_" + k))), None)
        if choices and value not in choices:
            raise bad(
                "one of " + ", ".join(repr(c) if isinstance(c, str) else str(c).lower() for c in choices)
            )
        return value
    if typing.get_origin(tp) is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise bad("a list")
        return [_coerce(args[0], v, key, origin) for v in value]
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad(f"a list of {len(args)} numbers")
        return tuple(_coerce(a, v, key, origin) for a, v in zip(args, value))
    return value


def to_dict(config) -> dict:
    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(config))


def load_config(
    cls: type, *, preset: str | None = None, file: str | None = None, overrides: dict | None = None
):
    """Stage defaults < preset < file < overrides, validated into `cls`.

    The layers are plain nested dicts, deep-merged so a later layer replaces only the keys it names;
    `from_dict` then applies the merged keys over `cls()`, whose nested groups come from each field's
    default_factory. A key no layer names keeps that stage default.
    """
    merged: dict = {}
    if preset:
        merged = deep_merge(merged, preset_dict(preset))
        merged["preset"] = preset
    if file:
        file_data = _read_yaml(Path(file))
        from_dict(cls, file_data, origin=str(file))  # checked alone first, so errors name the file
        merged = deep_merge(merged, file_data)
    if overrides:
        from_dict(cls, overrides, origin="command line")
        merged = deep_merge(merged, overrides)
    config = from_dict(cls, merged, origin=f"preset {preset}" if preset else "config")
    validate(config)
    if isinstance(config, RLConfig) and not config.uses_critic:
        _reject_critic_keys(config, [(str(file), file_data) if file else None, ("command line", overrides)])
    return config


# The PPO paper's evaluation sampling (sec. 6.1), which `rollout.sampling: paper` selects.
PAPER_SAMPLING = {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.1}


def rollout_sampling(rollout: RolloutConfig) -> dict[str, float]:
    """The temperature, top-p and repetition penalty rollouts use: PAPER_SAMPLING with
    `rollout.sampling: paper`, else the three fields."""
    if rollout.sampling == "paper":
        return dict(PAPER_SAMPLING)
    return {key: getattr(rollout, key) for key in PAPER_SAMPLING}


def _reject_critic_keys(config: RLConfig, layers: list) -> None:
    """A critic key that the user's file or flags set to anything but its default, with an estimator
    that builds no critic (the default states what a critic-free run does anyway)."""
    defaults = to_dict(RLConfig())

    def leaves(node, prefix: str = ""):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    for layer in layers:
        if not layer or not layer[1]:
            continue
        origin, data = layer
        for key, value in leaves(data):
            if not any(key == k or key.startswith(k + ".") for k in CRITIC_KEYS):
                continue
            default = defaults
            for part in key.split("."):
                default = default.get(part) if isinstance(default, dict) else None
            if value != default:
                raise ConfigError(
                    f"{origin}: {key} is set, but advantage.estimator {config.advantage.estimator!r} uses no "
                    "critic (none is built, trained or saved), so the setting would do nothing. Fix: remove "
                    f"{key}, or use --advantage.estimator gae for a PPO critic."
                )


def validate(config) -> None:
    """Cross-field and range checks, each naming the key and the fix; warnings for legal values that
    are almost certainly mistakes (`rlhf.config` logger)."""
    if isinstance(config, (SFTConfig, RewardConfig)):
        _validate_supervised(config)
    if isinstance(config, RLConfig):
        _validate_rl(config)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _at_least(value, low, key: str, why: str = "") -> None:
    _need(value >= low, f"{key} must be >= {low}, got {value!r}{why}. Fix: --{key} {low} or more.")


def _validate_optim(o: OptimConfig, group: str) -> None:
    _need(o.lr > 0, f"{group}.lr must be > 0 (0 trains nothing), got {o.lr!r}. Fix: --{group}.lr 1e-5.")
    _need(all(0 <= b < 1 for b in o.betas), f"{group}.betas must both be in [0, 1), got {list(o.betas)}.")
    _at_least(o.weight_decay, 0, f"{group}.weight_decay")
    _at_least(o.warmup_steps, 0, f"{group}.warmup_steps")
    _need(
        0 <= o.warmup_fraction < 1,
        f"{group}.warmup_fraction must be in [0, 1), got {o.warmup_fraction!r}. Fix: --{group}.warmup_fraction 0.1.",
    )
    _need(0 <= o.min_lr_ratio <= 1, f"{group}.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio!r}.")
    _need(
        o.max_grad_norm is None or o.max_grad_norm > 0,
        f"{group}.max_grad_norm must be > 0, or null to turn clipping off; got {o.max_grad_norm!r}.",
    )


def _validate_lora(lora: LoraConfig, group: str) -> None:
    if not lora.enabled:
        return
    _at_least(lora.r, 1, f"{group}.r")
    _need(lora.alpha > 0, f"{group}.alpha must be > 0, got {lora.alpha!r}.")
    _need(0 <= lora.dropout < 1, f"{group}.dropout must be in [0, 1), got {lora.dropout!r}.")


def _validate_supervised(c) -> None:
    """`rlhf sft` and `rlhf rm`: every count >= 1 and every fraction in range."""
    t, d = c.train, c.data
    _need(t.epochs > 0, f"train.epochs must be > 0, got {t.epochs!r}. Fix: --train.epochs 1.")
    _need(
        t.max_steps is None or t.max_steps >= 1,
        f"train.max_steps must be >= 1 (or null to run train.epochs), got {t.max_steps!r}.",
    )
    _at_least(t.batch_size, 1, "train.batch_size", " (examples per optimizer step)")
    _at_least(t.micro_batch_size, 1, "train.micro_batch_size", " (examples per forward/backward)")
    _at_least(t.log_every, 1, "train.log_every")
    _at_least(t.eval_every, 0, "train.eval_every", " (0: evaluate at the end only)")
    if isinstance(c, RewardConfig):
        _at_least(t.max_tokens, 1, "train.max_tokens")
        _at_least(t.min_batch, 1, "train.min_batch")
        _need(
            t.max_batch >= t.min_batch,
            f"train.max_batch ({t.max_batch!r}) must be >= train.min_batch ({t.min_batch!r}). "
            "Fix: --train.max_batch 128 --train.min_batch 4.",
        )
        _at_least(t.lm_coef, 0, "train.lm_coef")
    _need(0 <= d.test_fraction < 1, f"data.test_fraction must be in [0, 1), got {d.test_fraction!r}.")
    _at_least(d.max_prompt_tokens, 1, "data.max_prompt_tokens")
    _at_least(d.max_response_tokens, 1, "data.max_response_tokens")
    _validate_optim(c.optim, "optim")
    _validate_lora(c.lora, "lora")
    _need(
        c.dist.timeout > 0,
        f"dist.timeout must be > 0 seconds, got {c.dist.timeout!r}. Fix: --dist.timeout 600.",
    )


def _validate_rl(config: RLConfig) -> None:
    need = _need
    c = config
    need(
        c.train.iterations >= 1 or (c.train.iterations == 0 and c.critic.pretrain_iterations > 0),
        f"train.iterations must be >= 1, got {c.train.iterations!r} (0 only with critic.pretrain_iterations "
        "> 0, for a critic-only run). Fix: --train.iterations 1 or more.",
    )
    _at_least(c.rollout.batch_size, 1, "rollout.batch_size", " (prompts sampled per iteration)")
    _at_least(c.log.every, 1, "log.every")
    _at_least(c.log.eval_every, 0, "log.eval_every", " (0: off)")
    _at_least(c.log.samples_to_log, 0, "log.samples_to_log")
    for key in ("window", "baseline_steps", "patience"):
        _at_least(getattr(c.log.collapse, key), 1, f"log.collapse.{key}")
    _at_least(c.checkpoint.every, 0, "checkpoint.every", " (0: at the end only)")
    _at_least(c.checkpoint.keep, 1, "checkpoint.keep")
    need(
        c.dist.timeout > 0,
        f"dist.timeout must be > 0 seconds, got {c.dist.timeout!r}. Fix: --dist.timeout 600.",
    )
    _at_least(c.data.max_prompt_tokens, 1, "data.max_prompt_tokens")
    _at_least(c.data.ptx_batch_size, 1, "data.ptx_batch_size")
    _at_least(c.rollout.top_k, 0, "rollout.top_k", " (0: off)")
    need(c.rollout.repetition_penalty > 0, "rollout.repetition_penalty must be > 0 (1.0: off).")
    _at_least(c.model.value_coef, 0, "model.value_coef")
    _at_least(c.kl.horizon, 1, "kl.horizon")
    _at_least(c.critic.pretrain_patience, 1, "critic.pretrain_patience")
    _at_least(c.critic.pretrain_min_delta, 0, "critic.pretrain_min_delta")
    for group in ("policy_optim", "critic_optim"):
        _validate_optim(getattr(c, group), group)
    _validate_lora(c.model.lora, "model.lora")
    _validate_lora(c.model.critic_lora, "model.critic_lora")
    need(
        c.rollout.stop_at_eos or c.rollout.truncated != "drop",
        "rollout.stop_at_eos false makes every response run to rollout.max_new_tokens, so every response "
        "is truncated, and rollout.truncated drop drops them all: nothing is left to train on. Fix: "
        "--rollout.stop_at_eos true, or --rollout.truncated keep (or penalize).",
    )
    if 0 < c.rollout.temperature < MIN_USEFUL_TEMPERATURE:
        _config_logger.warning(
            "rollout.temperature %g is near 0: sampling is almost greedy and the log-probabilities of "
            "the sampled tokens are ~0, so the policy gradient is ~0 every iteration. Fix: "
            "--rollout.temperature 0.7 or more (1.0 samples the policy as trained).",
            c.rollout.temperature,
        )
    need(c.train.buffer_size >= 1, "train.buffer_size must be >= 1 (rollout batches kept).")
    need(c.train.ppo_epochs >= 1, "train.ppo_epochs must be >= 1.")
    need(c.train.minibatches >= 1, "train.minibatches must be >= 1.")
    need(c.train.micro_batch_size >= 1, "train.micro_batch_size must be >= 1.")
    need(c.rollout.batch_size >= c.train.minibatches, "train.minibatches must not exceed rollout.batch_size.")
    need(c.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1.")
    need(c.rollout.temperature > 0, "rollout.temperature must be > 0.")
    if c.rollout.sampling == "paper":  # the three fields are the paper's; one set otherwise is a conflict
        for key, value in PAPER_SAMPLING.items():
            mine = getattr(c.rollout, key)
            need(
                mine in (1.0, value),
                f"rollout.sampling paper samples with {key} {value}, but rollout.{key} is set to {mine!r}. "
                f"Fix: drop --rollout.{key}, or set --rollout.sampling custom.",
            )
    need(0 < c.rollout.top_p <= 1, "rollout.top_p must be in (0, 1].")
    need(c.kl.beta >= 0, "kl.beta must be >= 0 (0 turns the KL penalty off).")
    need(not c.kl.adaptive or c.kl.beta > 0, "kl.adaptive needs kl.beta > 0 as its initial value.")
    need(
        not c.kl.adaptive or c.kl.horizon >= c.rollout.batch_size * c.rollout.samples_per_prompt,
        f"kl.horizon must be >= the responses per rollout ({c.rollout.batch_size * c.rollout.samples_per_prompt}: "
        "rollout.batch_size x rollout.samples_per_prompt) with kl.adaptive, or the coefficient can turn negative.",
    )
    need(c.kl.target > 0, "kl.target must be > 0.")
    need(
        not c.reward.discounted or (c.reward.scale and not c.reward.normalize),
        "reward.discounted is a variant of reward scaling: set reward.scale true and reward.normalize false.",
    )
    need(0 <= c.reward.discount_gamma < 1, "reward.discount_gamma must be in [0, 1).")
    for key, value in (
        ("reward.clip", c.reward.clip),
        ("advantage.clip", c.advantage.clip),
        ("critic.value_clip", c.critic.value_clip),
        ("policy.awr_max_weight", c.policy.awr_max_weight),
    ):
        need(value is None or value > 0, f"{key} must be > 0, or null to turn it off.")
    need(0 <= c.advantage.gamma <= 1, "advantage.gamma must be in [0, 1].")
    need(0 <= c.advantage.lam <= 1, "advantage.lam must be in [0, 1].")
    need(c.policy.clip_eps > 0, "policy.clip_eps must be > 0.")
    need(
        c.policy.dual_clip is None or c.policy.dual_clip > 1,
        "policy.dual_clip must be > 1 (or null to turn it off).",
    )
    need(c.policy.apa_lam > 0, "policy.apa_lam must be > 0.")
    need(c.policy.awr_lam > 0, "policy.awr_lam must be > 0.")
    need(c.policy.entropy_coef >= 0, "policy.entropy_coef must be >= 0.")
    need(
        c.policy.entropy_clip >= 0, "policy.entropy_clip must be >= 0 (0: no flat region around the target)."
    )
    need(
        c.policy.entropy_target is None or c.policy.entropy_target >= 0,
        "policy.entropy_target must be >= 0 (an entropy in nats), or null for the plain bonus.",
    )
    if c.policy.entropy_target is not None and c.policy.entropy_coef == 0:
        _config_logger.warning(
            "policy.entropy_target is set but policy.entropy_coef is 0: the entropy term is off. "
            "Fix: --policy.entropy_coef 0.01 (the PPO paper's appendix B.3)."
        )
    need(c.policy.ptx_coef >= 0, "policy.ptx_coef must be >= 0.")
    need(c.critic.pretrain_iterations >= 0, "critic.pretrain_iterations must be >= 0.")
    _validate_estimator(c)


def _validate_estimator(c: RLConfig) -> None:
    """The advantage estimator, its groups and its loss settings (docs/algorithms.md, sec. 27-30)."""
    a, n = c.advantage, c.rollout.samples_per_prompt
    spec = estimator_spec(a.estimator)
    _at_least(n, 1, "rollout.samples_per_prompt")
    _need(
        not spec.needs_group or n >= 2,
        f"advantage.estimator {a.estimator} compares the responses to one prompt, but "
        f"rollout.samples_per_prompt is {n}: every group would have one member and no signal. "
        "Fix: --rollout.samples_per_prompt 4 (or more).",
    )
    _need(
        spec.needs_values or c.critic.pretrain_iterations == 0,
        f"critic.pretrain_iterations is {c.critic.pretrain_iterations}, but advantage.estimator "
        f"{a.estimator} uses no critic. Fix: --critic.pretrain_iterations 0, or --advantage.estimator gae.",
    )
    _need(a.group_eps >= 0, f"advantage.group_eps must be >= 0, got {a.group_eps!r}.")
    _need(c.policy.kl_loss_coef >= 0, "policy.kl_loss_coef must be >= 0 (0: no KL term in the loss).")
    _need(
        c.policy.loss_aggregation == "token_mean" or not c.uses_critic or c.model.critic_mode == "separate",
        "policy.loss_aggregation fixed_length with model.critic_mode shared would also rescale the value loss, "
        "which shares the policy's step. Fix: --model.critic_mode separate, or a critic-free estimator.",
    )
    if a.estimator == "dr_grpo" and c.policy.loss_aggregation != "fixed_length":
        _config_logger.warning(
            "advantage.estimator dr_grpo with policy.loss_aggregation %s: Dr. GRPO also divides the loss "
            "by a constant, not by the number of tokens. Fix: --policy.loss_aggregation fixed_length.",
            c.policy.loss_aggregation,
        )


def save_config(config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def config_from_yaml(cls: type, path: str | Path):
    """A config written by `save_config` (every key named), e.g. on resume."""
    return from_dict(cls, migrate_moved_keys(_read_yaml(Path(path))), origin=str(path))
