"""mutmut's hook (tests/bin/mutate puts this folder on its path): a mutant that changes
nothing but type annotations is skipped, not run. Every module checked has
``from __future__ import annotations``: its annotations are strings nothing evaluates,
so such a mutant (``int | None`` made ``int & None``) is equivalent by construction."""

from __future__ import annotations

import ast
from typing import Any

from mutmut import Context, mutate

_FUTURE = "from __future__ import annotations"


class _Unannotated(ast.NodeTransformer):
    """The module without its annotations (a variable's kept as a placeholder: its
    name still makes a dataclass field)."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = ast.Constant(None)
        self.generic_visit(node)
        return node


def _unannotated(source: str) -> str:
    return ast.dump(_Unannotated().visit(ast.parse(source)))


def pre_mutation(context: Any) -> None:
    source = context.source
    if _FUTURE not in source:
        return
    mutant = Context(
        source=source,
        mutation_id=context.mutation_id,
        filename=context.filename,
        config=context.config,
        dict_synonyms=context.dict_synonyms,
    )
    mutated, _ = mutate(mutant)
    try:
        context.skip = _unannotated(mutated) == _unannotated(source)
    except SyntaxError:  # not Python any more: the import fails, the tests say so
        return
