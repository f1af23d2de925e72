"""The environment protocol and its loading (`--env module:Class`, docs/environments.md).

    class Class:
        def __init__(self, row: dict): ...     # one episode per prompt row (the prompt file's fields)
        def step(self, response: str) -> tuple[str | None, float, bool]:
            '''The policy's turn -> (the reply appended as the next turn, or None; reward; done).'''

Nothing is imported unless the user names it. Whatever goes wrong in the user's code (a bad name,
a failed import, no `step`, an exception, wrong types, a non-finite reward) stops the run with one
message naming the key, the value and the fix: a ConfigError, exit code 2."""

from __future__ import annotations

import importlib
import inspect
import numbers
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rlhf.config import ConfigError
from rlhf.config.outside import outside_number

KEY = "env.name"


@runtime_checkable
class Environment(Protocol):
    """One episode: built from a prompt row, stepped with each policy turn's text."""

    def step(self, response: str) -> tuple[str | None, float, bool]: ...


class EnvError(ConfigError):
    """An environment that cannot be loaded, built or stepped, or that answered the wrong types (exit 2)."""


def _where(err: BaseException) -> str:
    """` at FILE:LINE` of the innermost frame outside this module and the import machinery."""
    if isinstance(err, SyntaxError) and err.filename:
        return f" at {err.filename}:{err.lineno}"
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if "importlib" not in f.filename
        and not f.filename.replace("\\", "/").endswith("rlhf/envs/protocol.py")
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def working_directory_importable() -> None:
    """Let a module in the working directory be named (`--env my_env:Game`, `--reward-fn
    my_rewards:score`) whichever way rlhf was started: `python -m rlhf` puts the working directory
    first on sys.path, the `rlhf` console script does not. Appended, so that a local file never
    shadows an installed package."""
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import(name: str, module_name: str):
    working_directory_importable()
    try:
        return importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise  # the user's Ctrl-C: the CLI's interrupted path
    except (Exception, SystemExit) as err:  # the user's module: whatever it raises is named
        sys.modules.pop(module_name, None)
        if (
            isinstance(err, ModuleNotFoundError)
            and err.name
            and (module_name + ".").startswith(err.name + ".")
        ):
            fix = "check the module name, and that its directory is on PYTHONPATH (or installed)"
        elif isinstance(err, SystemExit):
            fix = "put the module's script code under `if __name__ == '__main__':`"
        else:
            fix = f"import it in Python (python -c 'import {module_name}') and correct what fails"
        raise EnvError(
            f"{KEY} {name!r}: importing module {module_name!r} failed{_where(err)}: "
            f"{type(err).__name__}: {err}. Fix: {fix}."
        ) from None


@dataclass(frozen=True)
class EnvironmentClass:
    """A loaded environment class with the checks around every call of the user's code."""

    name: str  # "module:Class", as the user wrote it
    cls: type

    def episode(self, row: dict, index: int) -> Any:
        """`Class(row)`: the episode of the prompt file's row `index`."""
        try:
            return self.cls(dict(row))
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:
            fields = ", ".join(sorted(row)) or "none"
            raise EnvError(
                f"{KEY} {self.name}: {self.cls.__name__}(row) raised {type(err).__name__}: {err}{_where(err)} "
                f"on prompt row {index} (its fields: {fields}). Fix: give every line of the prompt file the "
                f"fields the environment reads, or correct its __init__."
            ) from None

    def step(self, env: Any, response: str, index: int, turn: int) -> tuple[str | None, float, bool]:
        """`env.step(response)`, its result checked: (a str or None, a finite number, a bool)."""
        where = f"{KEY} {self.name}: step() on prompt row {index}, turn {turn + 1}"
        try:
            result = env.step(response)
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:
            raise EnvError(
                f"{where} raised {type(err).__name__}: {err}{_where(err)} (the response: {response[:80]!r}). "
                "Fix: correct step(); it must accept any text the policy writes."
            ) from None
        return check_step_result(result, where)


def check_step_result(result: object, where: str) -> tuple[str | None, float, bool]:
    """(reply, reward, done) from what `step` returned, or an EnvError naming what is wrong."""
    shape = "step() must return (reply: str | None, reward: float, done: bool)"
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise EnvError(f"{where} returned {result!r}. Fix: {shape}.")
    reply, reward, done = result
    if reply is not None and not isinstance(reply, str):
        raise EnvError(f"{where} returned the reply {reply!r} ({type(reply).__name__}). Fix: {shape}; "
                       "the reply is the text appended as the next turn, or None.")  # fmt: skip
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise EnvError(f"{where} returned the reward {reward!r} ({type(reward).__name__}). Fix: {shape}; "
                       "the reward is a number.")  # fmt: skip
    reward = outside_number(reward, f"{where} returned the reward", "return a finite number on a sane scale "
                            "(e.g. between -10 and 10)", EnvError)  # fmt: skip
    if not isinstance(done, bool) and type(done).__name__ != "bool_":  # numpy's bool too
        raise EnvError(f"{where} returned done {done!r} ({type(done).__name__}). Fix: {shape}; "
                       "done is True when the episode is over.")  # fmt: skip
    return reply, float(reward), bool(done)


def load_environment(name: str) -> EnvironmentClass:
    """Import the class `module:Class` names (and only it), checked to be a class with `step` that
    is built from one row."""
    module_name, _, attribute = str(name).partition(":")
    if not module_name or not attribute:
        raise EnvError(
            f"{KEY} is {name!r}: name the module and the class, as 'module:Class' "
            "(e.g. rlhf.envs.calculator:Calculator). Fix: --env package.module:Class."
        )
    module = _import(name, module_name)
    cls: Any = module
    for part in attribute.split("."):
        cls = getattr(cls, part, None)
    if cls is None:
        raise EnvError(
            f"{KEY} {name!r}: module {module_name!r} has no {attribute!r}. Fix: name a class defined in it."
        )
    if not inspect.isclass(cls):
        raise EnvError(
            f"{KEY} {name!r} is a {type(cls).__name__}, not a class. Fix: name a class whose instances are "
            "built from a prompt row, Class(row: dict), and have step(response) -> (reply, reward, done)."
        )
    if not callable(getattr(cls, "step", None)):
        raise EnvError(
            f"{KEY} {name!r}: class {cls.__name__} has no step method. Fix: define "
            "step(self, response: str) -> tuple[str | None, float, bool] (docs/environments.md)."
        )
    try:
        inspect.signature(cls).bind({})
    except TypeError as err:
        raise EnvError(
            f"{KEY} {name!r}: {cls.__name__}(row) cannot be called with one prompt row ({err}). Fix: define "
            "__init__(self, row: dict) (the prompt file's fields of the episode)."
        ) from None
    except ValueError:  # a signature inspect cannot read (a C class): tried when an episode is built
        pass
    return EnvironmentClass(str(name), cls)
