"""The longest functions of a package, in lines by `ast` (from the `def` line to the last, the
docstring included, decorators not): where a reader's patience runs out first.

    python bench/tools/longest_functions.py [rlhf] [--most 10] [--rev GIT_REV]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path


def longest_functions(root: Path, most: int = 10, rev: str | None = None) -> list[tuple[int, str]]:
    """(lines, "path:line qualified name") of the `most` longest functions below `root` (in the work
    tree, or at git revision `rev`), longest first; a method is named with its class."""
    rows: list[tuple[int, str]] = []
    for name, text in _sources(root, rev).items():
        for node, owner in _functions(ast.parse(text, filename=name), ""):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            rows.append((lines, f"{name}:{node.lineno} {owner}{node.name}"))
    return sorted(rows, key=lambda row: (-row[0], row[1]))[:most]


def _sources(root: Path, rev: str | None) -> dict[str, str]:
    """{path relative to root's parent: source} of every .py file below root."""
    if rev is None:
        return {str(p.relative_to(root.parent)): p.read_text() for p in sorted(root.rglob("*.py"))}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root.parent, capture_output=True, text=True, check=True
        ).stdout

    names = git("ls-tree", "-r", "--name-only", rev, root.name).split()
    return {n: git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def _functions(node: ast.AST, owner: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child, owner
            yield from _functions(child, f"{owner}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{owner}{child.name}.")
        else:
            yield from _functions(child, owner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[2] / "rlhf"))
    parser.add_argument("--most", type=int, default=10)
    parser.add_argument("--rev", help="a git revision (default: the work tree)")
    args = parser.parse_args()
    for lines, name in longest_functions(Path(args.root).resolve(), args.most, args.rev):
        print(f"{lines:4d}  {name}")


if __name__ == "__main__":
    main()
