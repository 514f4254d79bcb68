"""The mutation check (``make mutate``, tests/bin/mutate; docs/mutation.md).

    check.py run [MODULE ...]     mutate each module of targets.txt (or those named)
    check.py score [MODULE ...]   the score per module and every survivor

The mutations are mutmut 2's (its operators, from the test extras); mutmut's own runner
is not used: here it crashed mid-run on a cache lookup and hung, and it counts pytest's
exit status 2 (a mutant that cannot be imported) as surviving. Here each mutant is
written into the tree in place (the editable install imports it), its module's tests
run in a child process killed at ten times their unmutated time (then: a timeout), and
the original written back, whatever happens. Results are kept per module in
.mutmut/MODULE.json: a killed (or timed out) mutant is not run again, the others are on
each run.

A mutant that changes nothing but a variable's annotation (``x: int | None = None``
made ``x: int & None = None``) is not run: every module checked has
``from __future__ import annotations``, so its annotations are strings nothing
evaluates (a dataclass reads only a field's name) and the mutant is equivalent.
"""

from __future__ import annotations

import ast
import difflib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mutmut import Context, list_mutations, mutate

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests/mutation/targets.txt"
RESULTS = ROOT / ".mutmut"
PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]


def targets(chosen: list[str]) -> list[tuple[str, list[str]]]:
    found = []
    for line in TARGETS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            module, *tests = line.split()
            if not chosen or module in chosen:
                found.append((module, tests))
    unknown = set(chosen) - {m for m, _ in found}
    if unknown:
        sys.exit(f"not in {TARGETS.name}: {', '.join(sorted(unknown))}")
    return found


class _Unannotated(ast.NodeTransformer):
    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = ast.Constant(None)
        self.generic_visit(node)
        return node


def _unannotated(source: str) -> str | None:
    try:
        return ast.dump(_Unannotated().visit(ast.parse(source)))
    except SyntaxError:
        return None


def _change(source: str, mutated: str) -> str:
    """The lines the mutant changed, removed then added."""
    diff = difflib.unified_diff(source.splitlines(), mutated.splitlines(), n=0, lineterm="")
    return " / ".join(
        f"{line[0]} {line[1:].strip()}"
        for line in list(diff)[2:]
        if line[:1] in "-+" and line[1:].strip()
    )


def _results_path(module: str) -> Path:
    return RESULTS / (module.replace("/", ".") + ".json")


def _run_tests(tests: list[str], timeout: float | None) -> int:
    return subprocess.run(
        [*PYTEST, *tests],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    ).returncode


def run(module: str, tests: list[str]) -> None:
    path = ROOT / module
    source = path.read_text()
    results_path = _results_path(module)
    old: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    # Unmutated, the tests must pass: twice tried, as a busy machine can fail one once.
    start = time.monotonic()
    if _run_tests(tests, None) != 0:
        start = time.monotonic()
        if _run_tests(tests, None) != 0:
            sys.exit(f"{module}: its tests fail unmutated: {' '.join(tests)}")
    # The machine is shared: a slow moment is not an endless loop.
    timeout = max(10 * (time.monotonic() - start), 60.0)
    plain = _unannotated(source)
    ids = list_mutations(Context(source=source, filename=module))
    results: dict[str, Any] = {}
    print(f"== {module}: {len(ids)} mutants, against {' '.join(tests)}", flush=True)
    for mid in ids:
        key = f"{mid.line_number + 1}:{mid.index}:{mid.line}"
        if old.get(key, {}).get("status") in ("killed", "timeout"):
            results[key] = old[key]
            continue
        mutated, _ = mutate(Context(source=source, mutation_id=mid, filename=module))
        if _unannotated(mutated) == plain and "from __future__ import annotations" in source:
            status = "equivalent"
        else:
            path.write_text(mutated)
            try:
                status = "killed" if _run_tests(tests, timeout) != 0 else "survived"
            except subprocess.TimeoutExpired:  # run() killed the tests' process
                status = "timeout"
            finally:
                path.write_text(source)
        results[key] = {
            "status": status,
            "line": mid.line_number + 1,
            "change": _change(source, mutated),
        }
        _save(results_path, results)  # a run stopped midway keeps what it found
    _save(results_path, results)
    score([module])


def _save(path: Path, results: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(results, indent=1))


def score(modules: list[str]) -> None:
    """A timeout counts as killed (an endless loop is seen), and is listed."""
    header = (
        f"{'module':36} {'mutants':>7} {'equiv.':>6} {'killed':>6} {'survived':>8} {'score':>6}"
    )
    print(header)
    listed = []
    for module in modules:
        path = _results_path(module)
        if not path.exists():
            print(f"{module:36} not run")
            continue
        results = json.loads(path.read_text())
        count = {s: 0 for s in ("equivalent", "killed", "timeout", "survived")}
        for r in results.values():
            count[r["status"]] += 1
            if r["status"] in ("survived", "timeout"):
                listed.append(f"{module}:{r['line']} {r['status']}: {r['change']}")
        killed = count["killed"] + count["timeout"]
        tried = killed + count["survived"]
        rate = f"{100 * killed / tried:.1f}%" if tried else "-"
        print(
            f"{module:36} {len(results):7} {count['equivalent']:6} {killed:6}"
            f" {count['survived']:8} {rate:>6}"
        )
    print("\n".join(listed))


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("run", "score"):
        sys.exit(__doc__)
    chosen = targets(argv[1:])
    if argv[0] == "score":
        score([m for m, _ in chosen])
        return
    # A stop by signal still writes each module back (run()'s finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit("stopped"))
    for module, tests in chosen:
        run(module, tests)


if __name__ == "__main__":
    main(sys.argv[1:])
