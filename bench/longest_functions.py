"""The longest functions of a package, in lines by `ast` (from the `def` line to the last, the
docstring included, decorators not): where a reader's patience runs out first (issue 36 asks for
the ten longest in its note).

    python bench/longest_functions.py [rlhf] [--most 10]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def longest_functions(root: Path, most: int = 10) -> list[tuple[int, str]]:
    """(lines, "path:line qualified name") of the `most` longest functions below `root`, longest
    first; a method is named with its class."""
    rows: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, owner in _functions(tree, ""):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            rows.append((lines, f"{path.relative_to(root.parent)}:{node.lineno} {owner}{node.name}"))
    return sorted(rows, key=lambda row: (-row[0], row[1]))[:most]


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
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1] / "rlhf"))
    parser.add_argument("--most", type=int, default=10)
    args = parser.parse_args()
    for lines, name in longest_functions(Path(args.root), args.most):
        print(f"{lines:4d}  {name}")


if __name__ == "__main__":
    main()
