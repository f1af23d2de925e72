"""Rewards computed by Python functions (`--reward-fn module:function`, `reward.functions`), alone or
added to a reward model's score (docs/algorithms.md#31-reward-functions, which gives the calling
convention: by keyword, as TRL calls its reward functions, one float per response).

The total reward is ``model_weight * RM score + sum_k weight_k * fn_k``; every part is logged.
Nothing is imported unless the user names it. Whatever goes wrong in the user's module (an import
error, SystemExit or KeyboardInterrupt, an exception, the wrong number of values, a value that is
not finite in float32) stops the run with one message naming `module:function` (and the row), exit
code 2."""

from __future__ import annotations

import importlib
import inspect
import math
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

import torch

from rlhf.config import ConfigError
from rlhf.config.outside import outside_number
from rlhf.envs.protocol import working_directory_importable
from rlhf.models.sampling import Rollout

# the keyword arguments a reward function may name -> what each holds
STANDARD_ARGUMENTS = ("prompts", "completions", "completion_ids")
ALIASES = {"responses": "completions", "response_token_ids": "completion_ids"}
ROWS_ARGUMENT = "rows"  # the prompt file's records themselves (one dict per response)
NOT_FIELDS = ("prompt", "completion", "completion_ids")  # row fields not passed by name (as TRL)


class RewardFunctionError(ConfigError):
    """A reward function that cannot be loaded or that returned something unusable (exit code 2)."""


@dataclass(frozen=True)
class RewardFunction:
    name: str  # "module:function", as the user wrote it
    weight: float
    fn: Callable[..., Any]
    named: tuple[str, ...] = ()  # the parameters it names, each passed by keyword
    required: tuple[str, ...] = ()  # those without a default
    var_keyword: bool = False  # it has **kwargs: every standard argument and field


def parse_specs(specs: Sequence[object], key: str = "reward.functions") -> list[tuple[str, float]]:
    """`["pkg.mod:fn", {"name": "pkg.mod:other", "weight": 0.5}]` -> [(name, weight)], checked."""
    parsed = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str):
            name, weight = spec, 1.0
        elif isinstance(spec, dict) and set(spec) <= {"name", "weight"} and "name" in spec:
            name, weight = spec["name"], spec.get("weight", 1.0)
        else:
            raise RewardFunctionError(
                f"{key}[{i}] is {spec!r}. Fix: 'module:function' or {{name: 'module:function', weight: 1.0}}."
            )
        module, _, attribute = str(name).partition(":")
        if not module or not attribute:
            raise RewardFunctionError(
                f"{key}[{i}] is {name!r}: name the module and the function, as 'module:function' "
                "(e.g. rlhf.worlds.reward:gold_reward). Fix: --reward-fn package.module:function."
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RewardFunctionError(
                f"{key}[{i}] ({name}): weight must be a finite number, got {weight!r}. "
                f"Fix: {{name: '{name}', weight: 1.0}}."
            )
        parsed.append((str(name), float(weight)))
    return parsed


# --- the user's code: KeyboardInterrupt it raises vs the user's Ctrl-C ----------------------------


@contextmanager
def _watch_ctrl_c() -> Iterator[list[bool]]:
    """Yields a flag list that holds True once a real SIGINT (Ctrl-C) arrived inside the block, so
    that a KeyboardInterrupt the user's code raises itself can be told from the user's Ctrl-C.
    Outside the main thread signals cannot be watched: the flag is then None-like (always True)."""
    seen = [False]
    if threading.current_thread() is not threading.main_thread():
        seen[0] = True  # cannot tell: treat it as a real interrupt
        yield seen
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen[0] = True
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # pragma: no cover - not the main interpreter
        seen[0] = True
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _user_frame(err: BaseException, file: str | None = None) -> str:
    """FILE:LINE of the innermost traceback frame in `file` (the function's own source), else the
    innermost outside this module and the standard import machinery."""
    if isinstance(err, SyntaxError) and err.filename:
        return f"{err.filename}:{err.lineno}"
    if file:
        own = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == file]
        if own:
            return f"{own[-1].filename}:{own[-1].lineno}"
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if "importlib" not in f.filename
        and f"{__name__.replace('.', '/')}.py" not in f.filename.replace("\\", "/")
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _source_file(fn: Callable[..., Any]) -> str | None:
    try:
        return inspect.getsourcefile(fn)
    except TypeError:  # a builtin, or a callable instance
        return None


def _import_failure(name: str, module_name: str, err: BaseException) -> RewardFunctionError:
    at = _user_frame(err)
    where = f" at {at}" if at else ""
    if isinstance(err, ModuleNotFoundError) and err.name and (module_name + ".").startswith(err.name + "."):
        return RewardFunctionError(
            f"reward function {name}: cannot import module {module_name!r} ({err}). Fix: check the name, "
            "and that its directory is on PYTHONPATH (or installed)."
        )
    if isinstance(err, SyntaxError):
        return RewardFunctionError(
            f"reward function {name}: module {module_name!r} has a syntax error{where}: {err.msg}. "
            "Fix: correct that line (python -m py_compile FILE shows it)."
        )
    if isinstance(err, ImportError):
        missing = f"install {err.name!r} or " if isinstance(err, ModuleNotFoundError) and err.name else ""
        return RewardFunctionError(
            f"reward function {name}: importing module {module_name!r} failed{where}: "
            f"{type(err).__name__}: {err}. Fix: {missing}correct the import in that module."
        )
    if isinstance(err, SystemExit):
        return RewardFunctionError(
            f"reward function {name}: importing module {module_name!r} called exit({err.code!r}){where}. "
            "Fix: put the module's script code under `if __name__ == '__main__':`."
        )
    if isinstance(err, KeyboardInterrupt):
        return RewardFunctionError(
            f"reward function {name}: importing module {module_name!r} raised KeyboardInterrupt{where} "
            "(no Ctrl-C was pressed). Fix: do not raise KeyboardInterrupt in the module."
        )
    return RewardFunctionError(
        f"reward function {name}: importing module {module_name!r} raised {type(err).__name__}: {err}{where}. "
        "Fix: import the module in Python (python -c 'import MODULE') and correct what fails."
    )


def _import(name: str, module_name: str) -> ModuleType:
    working_directory_importable()
    with _watch_ctrl_c() as ctrl_c:
        try:
            return importlib.import_module(module_name)
        except KeyboardInterrupt as err:
            if ctrl_c[0]:
                raise  # the user's Ctrl-C: the CLI's interrupted path
            sys.modules.pop(module_name, None)
            raise _import_failure(name, module_name, err) from None
        except (Exception, SystemExit) as err:  # the user's module: whatever it raises is named
            sys.modules.pop(module_name, None)
            raise _import_failure(name, module_name, err) from None


def calling_style(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """How `fn` is called: by the keywords its signature names (TRL's form)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable
        raise RewardFunctionError(
            f"reward function {name} has no signature to read (a builtin or C function); reward functions "
            "are called by keyword (prompts, completions, completion_ids, fields of the prompt file). Fix: "
            "wrap it in a Python function that names the arguments it takes."
        ) from None
    params = list(signature.parameters.values())
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        raise RewardFunctionError(
            f"reward function {name} takes positional-only arguments {positional_only}; reward functions are "
            "called by keyword (prompts, completions, completion_ids, fields of the prompt file). Fix: drop "
            "the `/` from its signature."
        )
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = tuple(p.name for p in params if p.kind in keyword)
    required = tuple(p.name for p in params if p.kind in keyword and p.default is p.empty)
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    return {"named": named, "required": required, "var_keyword": var_keyword}


def load_reward_functions(specs: Sequence[object], key: str = "reward.functions") -> list[RewardFunction]:
    """Import each named function (and only those), and read how it is called."""
    loaded = []
    for name, weight in parse_specs(specs, key):
        module_name, _, attribute = name.partition(":")
        module = _import(name, module_name)
        fn: Any = module
        for part in attribute.split("."):
            fn = getattr(fn, part, None)
        if not callable(fn):
            raise RewardFunctionError(
                f"reward function {name}: module {module_name!r} has no callable {attribute!r}. "
                "Fix: name a function defined in that module."
            )
        loaded.append(RewardFunction(name, weight, fn, **calling_style(name, fn)))
    return loaded


def check_row_fields(
    functions: Sequence[RewardFunction], rows: list[dict[str, Any]], path: str = "the prompts file"
) -> None:
    """Before any model runs: every argument a function requires is a standard one or a field of
    every line of the prompt file."""
    for reward in functions:
        for param in reward.required:
            if param in STANDARD_ARGUMENTS or param in ALIASES or param == ROWS_ARGUMENT:
                continue
            lacking = [i for i, row in enumerate(rows) if param not in row]
            if lacking:
                fields = sorted({k for row in rows for k in row})
                raise RewardFunctionError(
                    f"reward function {reward.name} takes {param!r}, which is neither a standard argument "
                    f"({', '.join(STANDARD_ARGUMENTS)}) nor a field of every line of {path} ({len(lacking)} of "
                    f"{len(rows)} lines lack it; the fields: {', '.join(fields) or 'none'}). Fix: add "
                    f'"{param}" to each line of {path}, or give the parameter a default.'
                )


def _arguments(
    reward: RewardFunction,
    prompts: list[str],
    responses: list[str],
    token_ids: list[list[int]],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    standard = {"prompts": prompts, "completions": responses, "completion_ids": token_ids}
    fields = sorted({k for row in rows for k in row if k not in NOT_FIELDS and k not in standard})
    wanted = set(reward.named)
    if reward.var_keyword:
        wanted |= set(standard) | set(fields)
    out = {}
    for name in sorted(wanted):
        if name in standard:
            out[name] = standard[name]
        elif name in ALIASES:
            out[name] = standard[ALIASES[name]]
        elif name == ROWS_ARGUMENT and name not in fields:
            out[name] = rows
        elif name in fields:
            missing = [i for i, row in enumerate(rows) if name not in row]
            if missing and name in reward.required:
                i = missing[0]
                raise RewardFunctionError(
                    f"reward function {reward.name} takes {name!r}, but the prompt file's line of row {i} "
                    f'(prompt {prompts[i][:60]!r}) has no such field. Fix: add "{name}" to every line of the '
                    "prompts file, or give the parameter a default."
                )
            out[name] = [row.get(name) for row in rows]
        elif name in reward.required:
            raise RewardFunctionError(
                f"reward function {reward.name} takes {name!r}, which is neither a standard argument "
                f"({', '.join(STANDARD_ARGUMENTS)}) nor a field of the prompt file's lines (fields: "
                f'{", ".join(fields) or "none"}). Fix: add "{name}" to each line of the prompts file, or give '
                "the parameter a default."
            )
    return out


def call_reward_function(
    reward: RewardFunction,
    prompts: list[str],
    responses: list[str],
    response_token_ids: list[list[int]],
    rows: list[dict[str, Any]],
    *,
    where: str = "",
    first_row: int = 0,
) -> torch.Tensor:
    """The function's rewards as a float32 [B] tensor (the dtype of the loss); any failure a
    RewardFunctionError naming it (and the row, counted from `first_row`)."""
    fix = "Fix: make it return one finite float per response, in order; stopped before training on it."
    size = len(prompts)
    first = f"the first: {responses[0][:60]!r} to {prompts[0][:60]!r}" if size else "no responses"
    kwargs = _arguments(reward, prompts, responses, response_token_ids, rows)
    with _watch_ctrl_c() as ctrl_c:
        try:
            out = reward.fn(**kwargs)
        except KeyboardInterrupt:
            if ctrl_c[0]:
                raise  # the user's Ctrl-C: the CLI's interrupted path
            raise RewardFunctionError(
                f"reward function {reward.name} raised KeyboardInterrupt ({where}{size} responses; {first}; no "
                "Ctrl-C was pressed). Fix: do not raise KeyboardInterrupt in a reward function."
            ) from None
        except SystemExit as err:
            raise RewardFunctionError(
                f"reward function {reward.name} called exit({err.code!r}) ({where}{size} responses; {first}). "
                "Fix: return the rewards (raise an exception on an error) instead of exiting."
            ) from None
        except Exception as err:  # the user's code: whatever it raises stops the run with its name
            at = _user_frame(err, _source_file(reward.fn))
            raise RewardFunctionError(
                f"reward function {reward.name} raised {type(err).__name__}: {err}{' at ' + at if at else ''} "
                f"({where}{size} responses; {first}). Fix: debug the function on that input."
            ) from None
    try:
        values = torch.as_tensor(out, dtype=torch.float64).detach().cpu()
    except OverflowError:  # a Python int beyond float64 (10**400): named by the check of each value
        items = list(out) if isinstance(out, (list, tuple)) else []
        values = torch.tensor([_float64(v) for v in items], dtype=torch.float64)
        if values.shape != (size,):
            raise RewardFunctionError(
                f"reward function {reward.name} returned {type(out).__name__} holding a number beyond float64 "
                f"({where}{size} responses). {fix}"
            ) from None
        for i, value in enumerate(out):
            _check_value(reward, value, i, prompts, responses, where, first_row=first_row)
    except (TypeError, ValueError, RuntimeError):
        raise RewardFunctionError(
            f"reward function {reward.name} returned {type(out).__name__}, not numbers ({where}{size} responses). {fix}"
        ) from None
    if values.shape != (size,):
        raise RewardFunctionError(
            f"reward function {reward.name} returned shape {tuple(values.shape)} for {size} responses "
            f"({where.rstrip(', ') or 'one call'}); expected ({size},). {fix}"
        )
    _require_finite(reward, values, prompts, responses, where, fix, first_row)
    return values.float()


def _float64(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return math.inf


def _check_value(
    reward: RewardFunction,
    value: object,
    i: int,
    prompts: list[str],
    responses: list[str],
    where: str,
    tail: str = "",
    first_row: int = 0,
) -> float:
    """One value through the check of every number from outside (rlhf/config/outside.py)."""
    context = f" ({where}response {responses[i][:60]!r} to prompt {prompts[i][:60]!r}{tail})"
    return outside_number(value, f"reward function {reward.name} returned",
                          "return rewards on a sane scale (e.g. between -10 and 10); stopped before training on it",
                          RewardFunctionError, after=f" for row {first_row + i}", context=context)  # fmt: skip


def _require_finite(
    reward: RewardFunction,
    values: torch.Tensor,
    prompts: list[str],
    responses: list[str],
    where: str,
    fix: str,
    first_row: int = 0,
) -> None:
    """Each value finite in float32 (the dtype the loss uses), and still so once weighted."""
    weighted = reward.weight * values.float()
    nonfinite = ~torch.isfinite(values) | ~torch.isfinite(values.float()) | ~torch.isfinite(weighted)
    bad = nonfinite.nonzero().flatten().tolist()
    if not bad:
        return
    i = bad[0]
    value = float(values[i])
    _check_value(reward, value, i, prompts, responses, where, f"; {len(bad)} unusable in all", first_row)
    raise RewardFunctionError(
        f"reward function {reward.name} returned {value} for row {first_row + i}, which times its weight "
        f"{reward.weight:g} is beyond float32 (the loss's dtype) ({where}response {responses[i][:60]!r} to prompt "
        f"{prompts[i][:60]!r}; {len(bad)} unusable in all). Fix: lower its weight or the scale of its rewards; "
        "stopped before training on it."
    )


def weighted_reward(
    functions: Sequence[RewardFunction],
    model_scores: torch.Tensor | None,
    model_weight: float,
    prompts: list[str],
    responses: list[str],
    response_token_ids: list[list[int]],
    rows: list[dict[str, Any]],
    *,
    where: str = "",
    raw: dict[str, torch.Tensor] | None = None,
    first_row: int = 0,
    others: dict[str, tuple[torch.Tensor, float]] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(total [B], {part name: its weighted values [B]}): ``model_weight * RM + sum weight_k * fn_k``,
    plus ``weight * values`` of each of `others` ({name: (values [B], weight)}, e.g. the LLM judge);
    `raw`, when given, receives each function's own values (unweighted, by name); a message counts
    the rows from `first_row`."""
    parts: dict[str, torch.Tensor] = {}
    if model_scores is not None:
        parts["reward_model"] = model_weight * model_scores.detach().float().cpu()
    for name, (values, weight) in (others or {}).items():
        parts[name] = weight * values.detach().float().cpu()
    for reward in functions:
        values = call_reward_function(
            reward, prompts, responses, response_token_ids, rows, where=where, first_row=first_row
        )
        parts[reward.name] = parts.get(reward.name, 0) + reward.weight * values
        if raw is not None:
            raw[reward.name] = values
    total = torch.stack(list(parts.values())).sum(0)
    if not bool(torch.isfinite(total).all()):  # each part finite, their sum (or a weight times one) not
        i = int((~torch.isfinite(total)).nonzero()[0])
        raise RewardFunctionError(
            f"the reward parts ({', '.join(parts)}) sum to {float(total[i])} for row {first_row + i} ({where}response "
            f"{responses[i][:60]!r}), beyond float32 (the loss's dtype). Fix: lower the weights or the scale "
            "of the functions' rewards; stopped before training on it."
        )
    device = model_scores.device if model_scores is not None else "cpu"
    return total.to(device), parts


def part_metrics(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """`reward/part/<name>`: the mean weighted value of each part (logged beside the total)."""
    return {f"reward/part/{name}": float(values.mean()) for name, values in parts.items()}


def rollout_texts(tokenizer: Any, rollout: Rollout) -> tuple[list[str], list[str], list[list[int]]]:
    """(prompt texts, response texts without EOS, response token ids with the EOS) of a rollout."""
    from rlhf.evaluation.judging import decode_responses

    prompts = [
        tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True).strip()
        for ids, mask in zip(rollout.prompt_ids.tolist(), rollout.prompt_mask.tolist())
    ]
    token_ids = [
        [t for t, m in zip(ids, mask) if m]
        for ids, mask in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist())
    ]
    return prompts, decode_responses(tokenizer, rollout), token_ids


Judge = Callable[[Rollout, list[str]], torch.Tensor]  # (rollout, response texts) -> scores [B]
JudgeFactory = Callable[[int, int], Judge]  # (first row, end row) -> the judge of those rows


def judge_with_functions(
    judge_factory: JudgeFactory | None,
    functions: Sequence[RewardFunction],
    tokenizer: Any,
    rows: list[dict[str, Any]],
    values: dict[str, list[torch.Tensor]] | None = None,
) -> JudgeFactory:
    """`rlhf eval`'s judge factory with the reward functions added (weight each; the judge's own score,
    if any, with weight 1): `factory(start, end) -> judge(rollout, responses) -> [B]`. `values`, when
    given, collects each function's own values of every call, in call order (`values[name]`)."""

    def factory(start: int, end: int) -> Judge:
        base = judge_factory(start, end) if judge_factory is not None else None

        def judge(rollout: Rollout, responses: list[str]) -> torch.Tensor:
            scores = base(rollout, responses) if base is not None else None
            prompts, _, token_ids = rollout_texts(tokenizer, rollout)
            raw: dict[str, torch.Tensor] = {}
            total, _ = weighted_reward(
                functions, scores, 1.0, prompts, responses, token_ids, rows[start:end],
                where="rlhf eval, ", raw=raw, first_row=start,  # row: the prompt's index from 0
            )  # fmt: skip
            if values is not None:
                for name, each in raw.items():
                    values.setdefault(name, []).append(each)
            return total.cpu()

        return judge

    return factory
