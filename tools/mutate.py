"""Mutation testing of the core: small AST mutants of a file, each run against that file's tests.

    python tools/mutate.py                                 # rlhf/core/*.py and rlhf/rl/experience.py
    python tools/mutate.py --files rlhf/core/stats.py --limit 20 --seed 1 --json out.json

Every mutant is one small change found by walking the file's AST: an operator swap (+ -, * /,
and/or), a comparison flip (< <=, > >=, == !=, is / is not, in / not in), a constant change
(0 <-> 1, n -> n + 1, True <-> False, float c -> 2c or 0), a reduction swap (sum <-> mean,
max <-> min, amax <-> amin, maximum <-> minimum), an argument-order swap of a two-argument call,
``return x`` -> ``return None``, or a removed statement (a call statement, an augmented assignment,
a ``raise``). Docstrings, imports, annotations, asserts and the text of error messages are left
alone. The edit is spliced into the source at the node's span, so the rest of the file is untouched.

Each mutant is written into a private copy of the repository (the working tree is never edited) and
the file's tests run there with ``pytest -x -q``: a failure kills it, a pass means it survived, and
a run past the time limit is a timeout. The report gives per file: mutants, killed, survived,
timeouts, kill rate (killed + timeouts over mutants) and every survivor as ``file:line: mutation``.
Survivors listed in the equivalents file (``docs/mutation.md``, lines ``- `file:line: mutation` ...``)
are reported apart, with the kill rate over the non-equivalent mutants.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "rlhf/core").glob("*.py")) + [
    "rlhf/rl/experience.py"
]
DEFAULT_JSON = "bench/results/mutation.json"
DEFAULT_EQUIVALENTS = "docs/mutation.md"
# Target file (glob) -> its tests, most specific first so that `-x` stops early on a kill.
TEST_MAP: dict[str, list[str]] = {
    "rlhf/core/*.py": ["tests/core/test_core_{stem}*.py", "tests/core/test_core_*.py"],
    "rlhf/rl/experience.py": [
        "tests/rl/test_experience_slicing.py",
        "tests/rl/test_trainer_plumbing.py",
    ],
}
STEM_ALIASES = {"advantages": "gae"}  # {stem} in TEST_MAP for a module whose tests are named otherwise
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "bench"
)

BINARY_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
                ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}  # fmt: skip
COMPARE_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                 ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
                 ast.In: ast.NotIn, ast.NotIn: ast.In}  # fmt: skip
REDUCTION_SWAPS = {"sum": "mean", "mean": "sum", "max": "min", "min": "max", "amax": "amin",
                   "amin": "amax", "maximum": "minimum", "minimum": "maximum"}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    path: str  # repository-relative
    line: int
    column: int  # 1-based, in characters
    start: int  # byte offsets of the replaced span in the file
    end: int
    original: str
    replacement: str
    kind: str

    @property
    def key(self) -> str:
        """``file:line:column: original -> replacement``, the name used in reports and the equivalents list."""
        return f"{self.path}:{self.line}:{self.column}: {self.original} -> {self.replacement}"

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


# -- finding mutants -----------------------------------------------------------------------------
def _skipped_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes whose subtrees are not mutated: docstrings, imports, annotations, asserts,
    f-strings (error messages), the message of a raise, `__all__`."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                mark(body[0])
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Assert | ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Raise):
            mark(node.exc)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.arg):
            mark(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mark(node.returns)
        elif _is_negative_number(node):
            skip.add(id(node.operand))
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            mark(node)
    return skip


def _constant_variants(value: object) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [1] if value == 0 else ([0, 2] if value == 1 else [value + 1])
    if isinstance(value, float):
        return [1.0] if value == 0 else [value * 2, 0.0]
    return []  # strings, None, ...: not mutated


def _is_negative_number(node: ast.AST) -> bool:
    """``-c`` for a number c: mutated as one constant (its inner c is not mutated on its own)."""
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    )


def _with(node: ast.AST, **changes: object) -> ast.AST:
    """A shallow copy of `node` with some fields replaced."""
    fields = {name: getattr(node, name) for name in node._fields}
    return type(node)(**{**fields, **changes})


def _node_mutations(node: ast.AST) -> list[tuple[str, ast.AST | str]]:
    """(kind, replacement node or source text) for every mutation of `node` itself."""
    out: list[tuple[str, ast.AST | str]] = []
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_SWAPS:
        out.append(("operator", _with(node, op=BINARY_SWAPS[type(node.op)]())))
    elif (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.Not | ast.Invert)
        and not (_is_negative_number(node))
    ):
        out.append(("operator", node.operand))
    elif isinstance(node, ast.BoolOp):
        out.append(("operator", _with(node, op=ast.Or() if isinstance(node.op, ast.And) else ast.And())))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE_FLIPS:
                ops = [*node.ops[:i], COMPARE_FLIPS[type(op)](), *node.ops[i + 1 :]]
                out.append(("comparison", _with(node, ops=ops)))
    elif isinstance(node, ast.Constant):
        out.extend(("constant", ast.Constant(v)) for v in _constant_variants(node.value))
    elif _is_negative_number(node):
        value = -node.operand.value
        out.extend(("constant", ast.Constant(v)) for v in [*_constant_variants(value), -value])
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in REDUCTION_SWAPS:
            swapped = (
                _with(func, attr=REDUCTION_SWAPS[name])
                if isinstance(func, ast.Attribute)
                else ast.Name(REDUCTION_SWAPS[name], ast.Load())
            )
            out.append(("reduction", _with(node, func=swapped)))
        args = node.args
        if len(args) == 2 and not any(isinstance(a, ast.Starred) for a in args):
            if ast.unparse(args[0]) != ast.unparse(args[1]):
                out.append(("argument order", _with(node, args=[args[1], args[0]])))
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            out.append(("return", "return None"))
    if isinstance(node, ast.Raise | ast.AugAssign) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    ):
        out.append(("statement removed", "pass"))
    return out


def find_mutants(path: str, source: bytes) -> list[Mutant]:
    """Every mutant of `source` (the file at repository-relative `path`), in source order."""
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    mutants, seen = [], set()
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "end_col_offset"):
            continue
        start = line_starts[node.lineno - 1] + node.col_offset
        end = line_starts[node.end_lineno - 1] + node.end_col_offset
        original = source[start:end].decode()
        for kind, new in _node_mutations(node):
            text = new if isinstance(new, str) else ast.unparse(new)
            if isinstance(node, ast.expr) and not isinstance(new, ast.Constant | ast.Name):
                text = f"({text})"  # the span excludes surrounding parentheses: keep precedence
            column = len(source[line_starts[node.lineno - 1] : start].decode()) + 1
            mutant = Mutant(path, node.lineno, column, start, end, _one_line(original), text, kind)
            mutated = mutant.apply(source)
            if mutated in seen or not _same_program_differs(source, mutated):
                continue
            seen.add(mutated)
            mutants.append(mutant)
    return sorted(mutants, key=lambda m: (m.start, m.end, m.replacement))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _same_program_differs(source: bytes, mutated: bytes) -> bool:
    """True if `mutated` parses and is a different program from `source` (not a no-op edit)."""
    try:
        return ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(source))
    except SyntaxError:
        return False


def choose(mutants: list[Mutant], limit: int | None, seed: int) -> list[Mutant]:
    """At most `limit` of `mutants`, a seeded sample kept in source order (all of them without a limit)."""
    if limit is None or len(mutants) <= limit:
        return mutants
    picked = random.Random(seed).sample(range(len(mutants)), limit)
    return [mutants[i] for i in sorted(picked)]


# -- running them --------------------------------------------------------------------------------
def tests_for(path: str, root: Path, test_map: dict[str, list[str]] = TEST_MAP) -> list[str]:
    """The test files of target `path` (`test_map`), existing ones only, each once, in map order."""
    stem = Path(path).stem.lstrip("_")
    stem = STEM_ALIASES.get(stem, stem)
    for pattern, test_globs in test_map.items():
        if Path(path).match(pattern):
            found: list[str] = []
            for test_glob in test_globs:
                for test in sorted(root.glob(test_glob.format(stem=stem))):
                    rel = str(test.relative_to(root))
                    if rel not in found:
                        found.append(rel)
            return found
    return []


def stages(path: str, root: Path, test_map: dict[str, list[str]] = TEST_MAP) -> list[list[str]]:
    """The tests of `path` in two runs: those of its own first glob (most mutants die there, and
    collecting one file is quick), then all of them; one run if the first glob finds none or all."""
    every = tests_for(path, root, test_map)
    pattern = next((p for p in test_map if Path(path).match(p)), None)
    if pattern is None:
        return []
    first = tests_for(path, root, {pattern: test_map[pattern][:1]})
    return [every] if not first or first == every else [first, every]


PRELOAD = ("torch", "numpy", "pytest", "hypothesis", "transformers")  # never rlhf: it is what gets mutated


def serve(copy: str, package: str) -> None:
    """Test server of one repository copy (``--serve``): reads a JSON request per stdin line,
    ``{"tests": [...], "timeout": s}``, and answers ``{"outcome": ..., "seconds": ...}``.

    Heavy imports happen once here; each run is a forked child that imports the (mutated) package
    afresh and runs ``pytest -x -q``. The child's SIGALRM ends a run past its time limit.
    """
    import importlib
    import importlib.util

    for name in PRELOAD:
        importlib.import_module(name)
    import torch

    torch.set_num_threads(1)
    os.chdir(copy)
    sys.path.insert(0, copy)
    sys.dont_write_bytecode = True  # a same-size mutant written within a second must not reuse a .pyc
    spec = importlib.util.find_spec(package)  # located, not imported
    if spec is None or not str(spec.origin).startswith(copy):
        where = spec.origin if spec else "nowhere"
        raise SystemExit(
            f"the mutation copy {copy} imports {package} from {where}: check PYTHONPATH/.pth files"
        )
    for line in sys.stdin:
        request = json.loads(line)
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            signal.alarm(max(1, int(request["timeout"])))
            import pytest

            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0", "-o", "addopts=",
                                *request["tests"]])  # fmt: skip
            os._exit(int(code))
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
            outcome = "timeout"
        elif os.WIFEXITED(status):
            # 1: a test failed; 2: interrupted, e.g. a mutant that breaks an import during collection
            outcome = {0: "passed", 1: "failed", 2: "failed"}.get(os.WEXITSTATUS(status), "error")
        else:
            outcome = "failed"  # the mutant crashed the interpreter (e.g. a segfault): detected
        print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - began}), flush=True)


class TestServer:
    """A private copy of the repository with its `serve` process."""

    def __init__(self, root: Path, into: Path, package: str) -> None:
        self.copy = into / "repo"
        shutil.copytree(root, self.copy, ignore=COPY_IGNORE)
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", str(self.copy), package],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, tests: list[str], timeout: float) -> tuple[str, float]:
        """("passed" | "failed" | "timeout" | "error", seconds) of ``pytest -x -q tests`` in the copy."""
        self.process.stdin.write(json.dumps({"tests": tests, "timeout": timeout}) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError("the mutation test server stopped unexpectedly")
        result = json.loads(answer)
        return result["outcome"], result["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def run_mutant(
    mutant: Mutant, servers: queue.Queue[TestServer], source: bytes, runs: list[list[str]], timeout: float
):
    server = servers.get()
    target = server.copy / mutant.path
    outcome, seconds = "passed", 0.0
    try:
        target.write_bytes(mutant.apply(source))
        for tests in runs:  # stop at the first run that does not pass
            outcome, took = server.run(tests, timeout)
            seconds += took
            if outcome != "passed":
                break
    finally:
        target.write_bytes(source)
        servers.put(server)
    status = {"failed": "killed", "passed": "survived", "timeout": "timeout"}.get(outcome, "error")
    return mutant, status, seconds


def read_equivalents(path: Path) -> set[str]:
    """Mutant keys listed as equivalent: markdown list items whose first code span is a key."""
    if not path.exists():
        return set()
    return set(re.findall(r"^\s*[-*] `([^`]+:\d+:\d+: [^`]+)`", path.read_text(), flags=re.M))


def mutate(files, *, root=REPO, test_map=TEST_MAP, limit=None, seed=0, jobs=2, timeout=None,
           equivalents=frozenset(), log=print, only=()):  # fmt: skip
    """Run the mutants of `files` (repository-relative) and return the report as a dict."""
    jobs = max(1, min(jobs, 2))
    report = {"seed": seed, "limit": limit, "files": {}}
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        servers: queue.Queue[TestServer] = queue.Queue()
        package = Path(files[0]).parts[0]  # the package the targets belong to, e.g. rlhf
        started = [TestServer(root, Path(tmp) / str(j), package) for j in range(jobs)]
        for server in started:
            servers.put(server)
        try:
            for path in files:
                report["files"][path] = _mutate_file(path, root, test_map, servers, jobs, limit, seed,
                                                     timeout, equivalents, log, only)  # fmt: skip
        finally:
            for server in started:
                server.close()
    return report


def _mutate_file(
    path, root, test_map, servers, jobs, limit, seed, timeout, equivalents, log, only=()
) -> dict:
    source = (root / path).read_bytes()
    mutants = choose(find_mutants(path, source), limit, seed)
    if only:
        mutants = [m for m in mutants if any(text in m.key for text in only)]
    if not mutants:
        log(f"{path}: no mutants")
        return summarize([], equivalents)
    server = servers.get()
    runs = stages(path, server.copy, test_map)  # the copy's tests: the tree may change meanwhile
    tests = runs[-1] if runs else []
    if not tests:
        servers.put(server)
        raise SystemExit(f"no tests mapped to {path}: add it to TEST_MAP in tools/mutate.py")
    baseline, seconds = server.run(tests, timeout=600)
    servers.put(server)
    if baseline != "passed":
        raise SystemExit(f"the tests of {path} do not pass unmutated ({baseline}): fix them first")
    limit_s = timeout if timeout is not None else max(20.0, 4 * seconds)
    log(f"{path}: {len(mutants)} mutants; tests: {' '.join(tests)} ({seconds:.1f}s unmutated)")
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda m: run_mutant(m, servers, source, runs, limit_s), mutants))
    summary = summarize(results, equivalents)
    log(f"  {summary['killed']} killed, {summary['survived']} survived, {summary['timeout']} timeouts")
    for survivor in summary["survivors"]:
        log(f"  survived: {survivor}")
    return summary


def summarize(results, equivalents) -> dict:
    count = {
        s: sum(1 for _, status, _ in results if status == s)
        for s in ("killed", "survived", "timeout", "error")
    }
    survivors = [m for m, status, _ in results if status == "survived"]
    equivalent = [m.key for m in survivors if m.key in equivalents]
    live = [m for m in survivors if m.key not in equivalents]
    total = len(results)
    detected = count["killed"] + count["timeout"]
    return {
        "mutants": total,
        **count,
        "kill_rate": detected / total if total else 1.0,
        "equivalent": len(equivalent),
        "kill_rate_non_equivalent": detected / (total - len(equivalent)) if total - len(equivalent) else 1.0,
        "survivors": [f"{m.key}  [{m.kind}]" for m in live],
        "equivalent_survivors": equivalent,
        "errors": [m.key for m, status, _ in results if status == "error"],
        "seconds": round(sum(s for _, _, s in results), 1),
    }


def table(report: dict) -> str:
    header = f"{'file':<28} {'mutants':>7} {'killed':>6} {'surv.':>5} {'t/o':>4} {'equiv.':>6} {'kill':>6} {'kill*':>6}"
    lines = [header, "-" * len(header)]
    totals = {"mutants": 0, "killed": 0, "survived": 0, "timeout": 0, "equivalent": 0}
    for path, r in report["files"].items():
        for k in totals:
            totals[k] += r[k]
        lines.append(
            f"{path:<28} {r['mutants']:>7} {r['killed']:>6} {r['survived']:>5} {r['timeout']:>4} "
            f"{r['equivalent']:>6} {r['kill_rate']:>6.1%} {r['kill_rate_non_equivalent']:>6.1%}"
        )
    t = totals
    detected = t["killed"] + t["timeout"]
    rate = detected / t["mutants"] if t["mutants"] else 1.0
    live = t["mutants"] - t["equivalent"]
    lines.append("-" * len(header))
    lines.append(
        f"{'total':<28} {t['mutants']:>7} {t['killed']:>6} {t['survived']:>5} {t['timeout']:>4} "
        f"{t['equivalent']:>6} {rate:>6.1%} {(detected / live if live else 1.0):>6.1%}"
    )
    lines.append("kill = (killed + timeouts) / mutants; kill* = the same over the non-equivalent mutants")
    for r in report["files"].values():
        lines.extend(f"  survived: {s}" for s in r["survivors"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--files", nargs="+", default=DEFAULT_FILES, help="target files, relative to the repo"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="at most this many mutants per file (a seeded sample)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="parallel test runs")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per mutant (default 4x the clean run)"
    )
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the report")
    parser.add_argument(
        "--equivalents", default=DEFAULT_EQUIVALENTS, help="markdown list of equivalent mutants"
    )
    parser.add_argument("--list", action="store_true", help="only list the mutants, run nothing")
    parser.add_argument("--only", nargs="+", default=(), metavar="TEXT",
                        help="run only the mutants whose name contains one of these (e.g. losses.py:201:)")  # fmt: skip
    parser.add_argument("--serve", nargs=2, metavar=("COPY", "PACKAGE"), help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.serve:
        serve(*args.serve)
        return 0
    for path in args.files:
        if not (REPO / path).is_file():
            print(f"error: --files {path}: no such file under {REPO}", file=sys.stderr)
            return 2
    if args.list:
        for path in args.files:
            for m in choose(find_mutants(path, (REPO / path).read_bytes()), args.limit, args.seed):
                if not args.only or any(text in m.key for text in args.only):
                    print(f"{m.key}  [{m.kind}]")
        return 0
    equivalents = read_equivalents(REPO / args.equivalents)
    report = mutate(args.files, limit=args.limit, seed=args.seed, jobs=args.jobs, timeout=args.timeout,
                    equivalents=equivalents, log=lambda s: print(s, flush=True), only=args.only)  # fmt: skip
    out = (REPO / args.json).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
