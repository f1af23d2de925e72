"""`rlhf plan`: what an RL run (or `rlhf sft`, `rm`, `dpo`) needs per rank, role by role, and whether
it fits a GPU (docs/scale.md).

A closed-form count of the bytes each role holds (parameters, gradients, AdamW moments) and of what
each phase adds (rollout: the policy's KV cache and one step's logits; forward: a logits chunk;
update: the largest trained role's gradients and one micro-batch's saved activations, both sides at
once when one process steps policy and critic side by side), for a model shape, a preset, LoRA,
a precision, a strategy (`none`/`ddp` whole, `fsdp2` per layer with the root unit and one or two
gathered layers, `rollout_gather per_layer`) and a rank count. The per-token activation count is
calibrated on measured peaks (bench/results/gpu_check_h200.json, dist_memory_*.json).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

STRATEGIES = ("none", "ddp", "fsdp2")
STAGES = ("rl", "sft", "rm", "dpo", "simpo")  # an RL run (its preset's roles) or a supervised stage
PAIR_STAGES = ("rm", "dpo", "simpo")  # a micro-batch of pairs: two rows in one forward
PRECISIONS = ("float32", "bfloat16", "bfloat16-pure")
GIB = 2**30
# saved activations per token and decoder layer, in elements: ~10 h (norm inputs and outputs, q k v,
# attention output, residuals) + 4 m (gate, up, activation, product); measured: docs/scale.md
ACTIVATION_H, ACTIVATION_M = 10, 4


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer (Llama / Qwen layout)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    positions: int | None = None  # max_position_embeddings: the longest sequence it reads (None: unknown)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_parameters(self) -> int:
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv  # q, o; k, v
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden  # MLP, two norms

    @property
    def parameters(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_parameters + embeddings + self.hidden  # final norm


# Llama / Qwen shapes by size (public model configs: Qwen2.5-0.5B/1.5B, Llama-2-7B/13B/70B)
NAMED_SHAPES = {
    "0.5b": Shape("0.5b (Qwen2.5-0.5B)", 896, 24, 14, 2, 4864, 151936, tied_embeddings=True, positions=32768),
    "1.5b": Shape(
        "1.5b (Qwen2.5-1.5B)", 1536, 28, 12, 2, 8960, 151936, tied_embeddings=True, positions=32768
    ),
    "7b": Shape("7b (Llama-2-7B)", 4096, 32, 32, 32, 11008, 32000, positions=4096),
    "13b": Shape("13b (Llama-2-13B)", 5120, 40, 40, 40, 13824, 32000, positions=4096),
    "70b": Shape("70b (Llama-2-70B)", 8192, 80, 64, 8, 28672, 32000, positions=4096),
    "smollm2-135m": Shape("smollm2-135m", 576, 30, 9, 3, 1536, 49152, tied_embeddings=True, positions=8192),
    "m84": Shape("m84 (bench/memory/gpu_memory.py)", 1024, 8, 16, 16, 2048, 4000),
}


def shape_of(model: str) -> Shape:
    """A named shape (`7b`, ...), or a Hugging Face directory / config.json read for its shape."""
    if model.lower() in NAMED_SHAPES:
        return NAMED_SHAPES[model.lower()]
    path = Path(model)
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise ValueError(
            f"--model {model!r} is neither a named shape nor a model directory with a config.json. "
            f"Fix: one of {', '.join(NAMED_SHAPES)}, or a save_pretrained directory."
        )
    try:
        c = json.loads(config_file.read_text())
        c = c.get("text_config", c)
        return Shape(
            name=str(path),
            hidden=int(c["hidden_size"]),
            layers=int(c["num_hidden_layers"]),
            heads=int(c["num_attention_heads"]),
            kv_heads=int(c.get("num_key_value_heads") or c["num_attention_heads"]),
            intermediate=int(c["intermediate_size"]),
            vocab=int(c["vocab_size"]),
            tied_embeddings=bool(c.get("tie_word_embeddings", False)),
            positions=_positions(c),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{config_file}: cannot read a decoder shape ({type(err).__name__}: {err}). Fix: a Llama/Qwen-style "
            f"config.json (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size), "
            f"or a named shape: {', '.join(NAMED_SHAPES)}."
        ) from None


def _positions(config: dict) -> int | None:
    """The positions a config.json says its model reads (as rlhf.models.backbone.model_context)."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def parse_bytes(text: str) -> int:
    """ "80GB", "80GiB", "24g" -> bytes (GB and GiB both read as 2**30, as GPU makers' 80 GB cards hold
    about 80 GiB usable)."""
    t = str(text).strip().lower().replace(" ", "")
    for suffix in ("gib", "gb", "g"):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * GIB)
    for suffix in ("mib", "mb", "m"):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * 2**20)
    return int(float(t))


@dataclass
class Job:
    """What runs: the roles of the preset, how they train, and the shapes of the batches."""

    shape: Shape
    # one of STAGES: sft, rm, dpo have no rollout (and no critic or reward model); simpo is `rlhf dpo
    # --dpo.loss simpo`, reference-free
    stage: str = "rl"
    critic: str = "separate"  # "separate" | "shared" | "none" (critic-free presets)
    reward_model: bool = True
    lora: bool = False
    lora_rank: int = 16
    dtype: str = "bfloat16"
    strategy: str = "fsdp2"
    ranks: int = 8
    micro_batch: int = 2  # rows per update forward/backward
    rollout_rows: int = 64  # responses per rollout (the whole batch: each rank samples 1/ranks)
    prompt_tokens: int = 512
    response_tokens: int = 512
    gradient_checkpointing: bool = False
    # fsdp2: the policy gathered whole for sampling ("whole", in the compute dtype, once per
    # rollout) or a layer at a time in every decoding step ("per_layer", `dist.rollout_gather`: for a
    # policy too big to hold whole)
    rollout_gather: str = "whole"
    # fsdp2: every role's shards, gradients and AdamW state in CPU memory (`dist.offload`)
    offload: bool = False
    # one process on a CPU of 2+ cores (`runtime.overlap_critic`, rlhf/runtime/local.py): the policy's
    # and a separate critic's steps run side by side, both roles' gradients and activations held at once
    overlap_critic: bool = False
    gpu_memory: int = 80 * GIB

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}. Fix: --strategy fsdp2."
            )
        if self.dtype not in PRECISIONS:
            raise ValueError(
                f"--dtype must be one of {', '.join(PRECISIONS)}, got {self.dtype!r}. Fix: --dtype bfloat16."
            )
        if self.offload and self.strategy != "fsdp2":
            raise ValueError(
                f"--offload needs --strategy fsdp2, got {self.strategy!r}. Fix: --strategy fsdp2, or drop --offload."
            )
        if self.rollout_gather not in ("whole", "per_layer"):
            raise ValueError(
                f"--rollout-gather must be whole or per_layer, got {self.rollout_gather!r}. Fix: --rollout-gather whole."
            )
        if self.rollout_gather == "per_layer" and self.strategy != "fsdp2":
            raise ValueError(
                f"--rollout-gather per_layer needs --strategy fsdp2, got {self.strategy!r}. Fix: --strategy fsdp2, or "
                "--rollout-gather whole."
            )
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if self.overlap_critic and (self.ranks != 1 or self.stage != "rl"):
            raise ValueError(
                f"--overlap-critic is one process's (rlhf train on 1 rank), got {self.ranks} ranks ({self.stage})"
            )
        if self.critic not in ("separate", "shared", "none"):
            raise ValueError(f"critic must be separate, shared or none, got {self.critic!r}")
        for name in ("ranks", "micro_batch", "rollout_rows", "prompt_tokens", "response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        positions = self.shape.positions
        if positions is not None and self.prompt_tokens + self.response_tokens > positions:
            raise ValueError(
                f"--prompt-tokens {self.prompt_tokens} + --response-tokens {self.response_tokens} = "
                f"{self.prompt_tokens + self.response_tokens} tokens a sequence, more than the {positions} positions "
                f"of --model {self.shape.name} (max_position_embeddings): it cannot read them. Fix: lower the two so "
                f"that they sum to at most {positions}."
            )


@dataclass
class RoleMemory:
    role: str
    parameters: int  # elements of the whole model
    trained: int  # elements the optimizer steps
    weights: int  # bytes held per rank at rest
    gradients: int  # bytes per rank during its step
    optimizer: int  # bytes per rank (AdamW moments)


@dataclass
class Plan:
    job: dict[str, Any]
    roles: list[RoleMemory]
    phases: dict[str, int]  # bytes per rank at each phase's peak
    extras: dict[str, int]  # what the phases add to the resident roles, bytes per rank
    peak_phase: str
    per_rank_peak_bytes: int
    fits: bool
    advice: list[str] = field(default_factory=list)
    host_bytes_per_rank: int = 0  # --offload: the shards and AdamW state held in CPU memory

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        return {"per_rank_peak_bytes": self.per_rank_peak_bytes, "fits": self.fits, **out}


def _lora_parameters(shape: Shape, rank: int) -> int:
    """LoRA on q_proj and v_proj of every layer (`lora.target_modules` null: PEFT's Llama default,
    the library's), r (in + out) elements each."""
    kv = shape.kv_heads * shape.head_dim
    return shape.layers * rank * ((shape.hidden + shape.hidden) + (shape.hidden + kv))


def _bytes(job: Job) -> tuple[int, int]:
    """(bytes per parameter held, bytes per element computed): bfloat16 keeps float32 master weights."""
    return (2 if job.dtype == "bfloat16-pure" else 4), (4 if job.dtype == "float32" else 2)


def role_memory(job: Job) -> list[RoleMemory]:
    """Each role's parameters and the bytes one rank holds of its weights, gradients and AdamW state."""
    s, param_bytes = job.shape, _bytes(job)[0]
    sharded = job.strategy == "fsdp2"  # every role, trained or frozen, 1/N

    def role(name: str, parameters: int, trained: int) -> RoleMemory:
        def held(elements: int, sharded: bool) -> int:
            return (-(-elements // job.ranks) if sharded else elements) * param_bytes

        return RoleMemory(
            name,
            parameters,
            trained,
            held(parameters, sharded),
            held(trained, sharded),
            2 * held(trained, sharded),
        )

    p = s.parameters
    adapters = _lora_parameters(s, job.lora_rank)
    # a critic and a reward model are a causal LM with a scalar head (rlhf.models.scalar_head): the
    # whole LM, its output head included, and hidden + 1 head parameters
    scalar = p + s.hidden + 1
    if job.stage == "rm":  # `rlhf rm`: the reward model trained (LoRA: adapters and the head)
        head = s.hidden + 1
        return [
            role("reward_model", scalar + adapters, adapters + head)
            if job.lora
            else role("reward_model", scalar, scalar)
        ]
    roles = [role("policy", p + adapters, adapters) if job.lora else role("policy", p, p)]
    if job.stage == "sft":
        return roles
    if job.stage == "simpo":  # no reference at all
        return roles
    if not job.lora:  # a LoRA policy's reference is its adapter switched off: no copy
        roles.append(role("reference", p, 0))
    if job.stage == "dpo":
        return roles
    if job.critic == "separate":
        head = s.hidden + 1
        roles.append(
            role("critic", scalar + adapters, adapters + head) if job.lora else role("critic", scalar, scalar)
        )
    if job.reward_model:
        roles.append(role("reward_model", scalar, 0))
    return roles


def phase_extras(job: Job, roles: list[RoleMemory]) -> dict[str, int]:
    """What each phase adds to the resident roles on one rank, in bytes."""
    s = job.shape
    param_bytes, compute_bytes = _bytes(job)
    rl = job.stage == "rl"
    rows_per_rank = -(-job.rollout_rows // job.ranks) if rl else 0  # the supervised stages: no rollout
    tokens = job.prompt_tokens + job.response_tokens
    layers_gathered = 2 * s.layer_parameters * compute_bytes  # this layer and the next (prefetch)
    root = s.parameters - s.layers * s.layer_parameters  # the root unit: embeddings, final norm (, head)
    policy = roles[0].parameters
    # the policy's whole parameters while sampling (fsdp2: in the compute dtype, once per rollout; with
    # rollout_gather per_layer one decoder layer at a time and the root unit, embeddings and output
    # head, held through the rollout)
    if job.strategy == "fsdp2":
        if job.rollout_gather == "whole":
            gathered_policy = policy * compute_bytes
        else:
            # one layer gathered at a time, twice while FSDP2 copies its all-gather buffer out
            # (measured by bench/memory/dist_memory.py); the root unit held through the rollout
            gathered_policy = layers_gathered + root * compute_bytes
        # the root unit stays gathered from a forward's start through its backward (FSDP2 keeps the
        # root unsharded between them; measured: docs/scale.md, the 2-rank CPU peaks)
        gathered_trained = layers_gathered + root * compute_bytes
    else:
        gathered_policy = gathered_trained = 0
    gathered_policy = gathered_policy if rl else 0
    rows_per_micro = job.micro_batch * (2 if job.stage in PAIR_STAGES else 1)  # a pair: 2 rows
    micro_tokens = rows_per_micro * tokens
    saved_per_layer = micro_tokens * (ACTIVATION_H * s.hidden + ACTIVATION_M * s.intermediate) * compute_bytes
    if job.gradient_checkpointing:  # the layers' inputs, and one layer recomputed at a time
        activations = s.layers * micro_tokens * s.hidden * compute_bytes + saved_per_layer
    else:
        activations = s.layers * saved_per_layer
    gradients = max(r.gradients for r in roles if r.trained)
    critic = next((r for r in roles if r.role == "critic"), None)
    beside = critic.gradients + activations if job.overlap_critic and critic is not None else 0
    return {
        "rollout: KV cache": 2 * s.layers * s.kv_heads * s.head_dim * tokens * rows_per_rank * compute_bytes,
        "rollout: sampler logits": rows_per_rank * s.vocab * 4 * 2,  # float32 logits and their softmax
        "rollout: gathered policy": gathered_policy,
        "forward/update: gathered parameters": gathered_trained,
        "forward/update: logits chunk": rows_per_micro * min(tokens, 1024) * s.vocab * 4 // 4,
        "update: gradients of the largest role": gradients,
        "update: saved activations": activations,
        "update: critic's step beside (CPU)": beside,  # its gradients and (as many) activations
    }


PHASE_EXTRAS = {
    "rollout": ("rollout: KV cache", "rollout: sampler logits", "rollout: gathered policy"),
    "forward": ("forward/update: gathered parameters", "forward/update: logits chunk"),
    "update": (
        "forward/update: gathered parameters",
        "forward/update: logits chunk",
        "update: gradients of the largest role",
        "update: saved activations",
        "update: critic's step beside (CPU)",
    ),
}


def plan(job: Job, *, with_advice: bool = True) -> Plan:
    """The plan of `job`; `with_advice`: when it does not fit, re-plan each remedy to rank them."""
    job.validate()
    job = as_run(job)
    roles = role_memory(job)
    extras = phase_extras(job, roles)
    resident = sum(r.weights + r.optimizer for r in roles)
    host = 0
    if job.offload:  # the shards, their gradients and AdamW state live in CPU memory
        host = resident + extras["update: gradients of the largest role"]
        resident, extras = 0, {**extras, "update: gradients of the largest role": 0}
    phases = {
        phase: resident + sum(extras[k] for k in keys)
        for phase, keys in PHASE_EXTRAS.items()
        if job.stage == "rl" or phase != "rollout"  # the supervised stages sample nothing
    }
    peak_phase = max(phases, key=lambda phase: phases[phase])
    peak = phases[peak_phase]
    fits = peak <= job.gpu_memory
    return Plan(
        job={**asdict(job), "shape": asdict(job.shape), "parameters": job.shape.parameters},
        roles=roles,
        phases=phases,
        extras=extras,
        peak_phase=peak_phase,
        per_rank_peak_bytes=peak,
        fits=fits,
        advice=advice(job) if with_advice and not fits else [],
        host_bytes_per_rank=host,
    )


def as_run(job: Job) -> Job:
    """`job` as it runs: on 1 rank every strategy is the one process's (torchrun at world size 1 runs
    the local runtime, rlhf/parallel/process_group.py: nothing sharded, gathered or offloaded)."""
    if job.ranks == 1 and job.strategy != "none":
        return replace(job, strategy="none", offload=False, rollout_gather="whole")
    return job


PER_LAYER_ADVICE = "--rollout-gather per_layer (sample a layer at a time, without the whole policy)"


def advice(job: Job) -> list[str]:
    """What would bring the peak under the GPU's memory, most effective first (each re-planned); the
    per-layer rollout first, with the reason, when it alone makes the job fit (the whole policy
    gathered for sampling is then what does not fit)."""
    tries: list[tuple[bool, int, str, bool]] = []
    options: list[tuple[str, dict[str, Any]]] = [
        ("--strategy fsdp2 (shard every role per layer)", {"strategy": "fsdp2"}),
        (PER_LAYER_ADVICE, {"strategy": "fsdp2", "rollout_gather": "per_layer"}),
        ("--offload (shards and AdamW state in CPU memory)", {"strategy": "fsdp2", "offload": True}),
        ("--lora (train adapters; the reference is the adapter off)", {"lora": True}),
        ("--gradient-checkpointing", {"gradient_checkpointing": True}),
        ("--micro-batch 1", {"micro_batch": 1}),
        (f"--nodes 2 (ranks {job.ranks * 2})", {"ranks": job.ranks * 2}),
        ("--dtype bfloat16-pure (bf16 weights and AdamW state)", {"dtype": "bfloat16-pure"}),
    ]
    for label, change in options:
        if job.stage != "rl" and "rollout_gather" in change:
            continue  # no rollout
        if job.overlap_critic and "strategy" in change:
            continue  # one process's (a CPU run's) figures: another strategy is another run
        if all(getattr(job, k) == v for k, v in change.items()):
            continue
        trial = plan(Job(**{**asdict(job), "shape": job.shape, **change}), with_advice=False)
        first = label == PER_LAYER_ADVICE and trial.fits and job.strategy == "fsdp2"
        if first:
            whole = phase_extras(job, role_memory(job))["rollout: gathered policy"]
            reason = f"the whole policy gathered for sampling, {gib(whole)}, is what does not fit"
            label = f"{label[:-1]}; {reason})"
        tries.append((not first, trial.per_rank_peak_bytes, label, trial.fits))
    tries.sort()
    return [f"{label}: {gib(peak)} per rank{' (fits)' if ok else ''}" for _, peak, label, ok in tries[:4]]


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"


def render(result: Plan) -> str:
    """The one-screen table: bytes per rank per role, each phase's peak, the verdict."""
    j = result.job
    command = "rlhf dpo --dpo.loss simpo" if j["stage"] == "simpo" else "rlhf " + j["stage"]
    lines = [
        f"rlhf plan: {j['shape']['name']} ({j['parameters'] / 1e9:.2f}B parameters), "
        f"{'critic ' + j['critic'] if j['stage'] == 'rl' else command}, "
        f"{'LoRA r=' + str(j['lora_rank']) if j['lora'] else 'full'}, {j['dtype']}, {j['strategy']} on "
        f"{j['ranks']} ranks{' (rollout gathered per layer)' if j['rollout_gather'] == 'per_layer' else ''}"
        f"{' (offloaded)' if j['offload'] else ''}, micro-batch {j['micro_batch']}, "
        f"{j['prompt_tokens']}+{j['response_tokens']} tokens",
        "",
        f"{'role':<14}{'parameters':>14}{'trained':>14}{'weights':>12}{'gradients':>12}{'AdamW':>12}   (per rank)",
    ]
    for r in result.roles:
        lines.append(
            f"{r.role:<14}{r.parameters:>14,}{r.trained:>14,}{gib(r.weights):>12}{gib(r.gradients):>12}{gib(r.optimizer):>12}"
        )
    lines.append("")
    for name, value in result.extras.items():
        if j["stage"] != "rl" and name.startswith("rollout"):
            continue  # the supervised stages sample nothing
        if name.endswith("beside (CPU)") and not j["overlap_critic"]:
            continue
        lines.append(f"{name:<34}{gib(value):>12}")
    lines.append("")
    for phase, value in result.phases.items():
        mark = "  <- peak" if phase == result.peak_phase else ""
        lines.append(f"{phase:<10}{gib(value):>12}{mark}")
    gpu = j["gpu_memory"]
    verdict = "fits" if result.fits else "does not fit"
    lines.append("")
    lines.append(
        f"{verdict}: {gib(result.per_rank_peak_bytes)} per rank at its peak ({result.peak_phase}) of {gib(gpu)}"
    )
    if result.host_bytes_per_rank:
        lines.append(f"offloaded: {gib(result.host_bytes_per_rank)} per rank in CPU memory")
    for line in result.advice:
        lines.append(f"  try {line}")
    return "\n".join(lines)
