"""The mutation check's score per module, from the results tests/bin/mutate keeps
(.mutmut/MODULE.xml, mutmut's JUnit XML), and each surviving mutant's change, for
docs/mutation.md.

A survivor that changes nothing but a variable's annotation (mutmut 2 mutates those:
``x: int | None = None`` made ``x: int & None = None``) is counted as equivalent: every
module checked has ``from __future__ import annotations``, so an annotation is a string
that nothing evaluates (a dataclass reads only the field's name from it).

    .venv/bin/python tests/mutation/score.py [MODULE ...]   (default: every one run)

A mutant that made the tests run past ten times their time unmutated (mutmut's timeout)
is counted as killed, and listed: an endless loop, or a machine too busy to tell.
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

RESULTS = Path(".mutmut")


def _changed(diff: str) -> str:
    """The diff's removed and added lines, stripped: what the mutant changed."""
    lines = diff.splitlines()[2:]  # below the ---/+++ header
    return " / ".join(
        line[0] + " " + line[1:].strip() for line in lines if line[:1] in "-+" and line[1:].strip()
    )


class _Unannotated(ast.NodeTransformer):
    """A module with its variables' annotations blanked (their names kept)."""

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = ast.Constant(None)
        self.generic_visit(node)
        return node


def _unannotated(source: str) -> str | None:
    try:
        return ast.dump(_Unannotated().visit(ast.parse(source)))
    except SyntaxError:
        return None


def _annotation_only(module: str, diff: str) -> bool:
    """Whether the mutant's diff (one hunk) changes only annotations of ``module``."""
    source = Path(module).read_text()
    if "from __future__ import annotations" not in source:
        return False
    hunk = re.search(r"^@@ -(\d+)(?:,(\d+))? ", diff, re.MULTILINE)
    if hunk is None:
        return False
    start, length = int(hunk[1]), int(hunk[2] or 1)
    body = diff[hunk.end() :].split("\n", 1)[1].splitlines()
    new = [line[1:] for line in body if line[:1] in " +"]
    lines = source.splitlines()
    mutated = "\n".join(lines[: start - 1] + new + lines[start - 1 + length :]) + "\n"
    plain = _unannotated(source)
    return plain is not None and _unannotated(mutated) == plain


def main(modules: list[str]) -> int:
    # tests/bin/mutate names each module's results after its path, dots for slashes.
    names = [m.replace("/", ".") for m in modules]
    files = [RESULTS / f"{n}.xml" for n in names] if modules else sorted(RESULTS.glob("*.xml"))
    for path in [p for p in files if not p.exists()]:
        print(f"{path}: not run", file=sys.stderr)
        files.remove(path)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    listed: dict[str, list[str]] = defaultdict(list)
    for path in files:
        for case in ET.parse(path).iter("testcase"):
            module = case.get("file", "")
            failure = case.find("failure")
            if failure is None:
                counts[module]["killed"] += 1
                continue
            diff = failure.text or ""
            if failure.get("message") == "bad_timeout":
                kind = "timeout"
            elif _annotation_only(module, diff):
                kind = "equivalent"
            else:
                kind = "survived"
            counts[module]["killed" if kind == "timeout" else kind] += 1
            if kind != "equivalent":
                number = case.get("name", "").rsplit("#", 1)[-1]
                listed[module].append(
                    f"  {kind} #{number} line {case.get('line')}: {_changed(diff)}"
                )
    print(f"{'module':36} {'mutants':>7} {'equiv.':>6} {'killed':>6} {'survived':>8} {'score':>6}")
    for module, c in sorted(counts.items()):
        run = c["killed"] + c["survived"]
        score = f"{100 * c['killed'] / run:.1f}%" if run else "-"
        total, equivalent = run + c["equivalent"], c["equivalent"]
        print(f"{module:36} {total:7} {equivalent:6} {c['killed']:6} {c['survived']:8} {score:>6}")
    for module, lines in sorted(listed.items()):
        print(f"\n{module}:")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
