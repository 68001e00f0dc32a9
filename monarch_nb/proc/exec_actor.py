"""The actor behind ``%%monarch exec``: runs notebook code in a proc, in a namespace
that persists across cells (one per proc, shared by every exec on it)."""

from __future__ import annotations

import ast

from .actor import Actor, endpoint

_namespace: dict = {"__name__": "__monarch_exec__"}
MESH_SUFFIX = ".exec"  # the exec actor mesh of proc mesh P is P.exec: the magic's machinery, hidden in views


def mesh_name(proc_mesh: str) -> str:
    return f"{proc_mesh}{MESH_SUFFIX}"


class Exec(Actor):
    """``run(code)`` executes ``code`` like a notebook cell: statements run in order and
    the value of a final expression is returned (``None`` when there is none). It runs
    on the proc's main thread, so an interrupt stops even a blocking call like
    ``time.sleep``."""

    _monarch_main_thread = True

    @endpoint
    def run(self, code: str, cell_name: str = "<monarch exec>"):
        tree = ast.parse(code, cell_name, "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, cell_name, "exec"), _namespace)
        if last is None:
            return None
        return eval(compile(ast.Expression(last.value), cell_name, "eval"), _namespace)
