"""The longest functions of a tree (by `ast`: lines from `def` to the last line of the body).

python tools/longest_functions.py [ROOT=rlhf] [--top 10] [--rev GIT_REV]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path


def sources(root: str, rev: str | None) -> dict[str, str]:
    if rev is None:
        return {str(p): p.read_text() for p in sorted(Path(root).rglob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, root], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        n: subprocess.run(["git", "show", f"{rev}:{n}"], capture_output=True, text=True, check=True).stdout
        for n in names
        if n.endswith(".py")
    }


def longest(files: dict[str, str], top: int) -> list[tuple[int, str]]:
    found = []
    for path, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", nargs="?", default="rlhf")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--rev", help="a git revision (default: the work tree)")
    args = parser.parse_args()
    for lines, where in longest(sources(args.root, args.rev), args.top):
        print(f"{lines:5d}  {where}")


if __name__ == "__main__":
    main()
