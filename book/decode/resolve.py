"""A step's change to a loop that one function runs for every step, read from the library: the function's source
as each step's configuration runs it (every test on ``cfg`` resolved), and the diff of the two. Chapters 07 and 08
build their steps as configurations of one loop, so this is how their pages show each step's code as a diff."""

from __future__ import annotations

import ast
import inspect
import textwrap


def _is_cfg(node) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg"


class _Resolve(ast.NodeTransformer):
    """Resolve every test on ``cfg.<field>`` a configuration decides: an ``if`` keeps the branch it takes, a
    conditional expression its value, a boolean operation drops the operands it decides."""

    def __init__(self, cfg):
        self.cfg = cfg

    def decided(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if _is_cfg(node):
            value = getattr(self.cfg, node.attr)
            return value if isinstance(value, bool) else None
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and _is_cfg(node.left):
            try:
                right = ast.literal_eval(node.comparators[0])
            except ValueError:
                return None
            value, op = getattr(self.cfg, node.left.attr), type(node.ops[0])
            return {ast.Eq: lambda: value == right, ast.NotEq: lambda: value != right,
                    ast.In: lambda: value in right, ast.NotIn: lambda: value not in right}.get(op, lambda: None)()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            value = self.decided(node.operand)
            return None if value is None else not value
        if isinstance(node, ast.BoolOp):
            values = [self.decided(v) for v in node.values]
            stop = isinstance(node.op, ast.Or)  # the value that decides the whole: True for or, False for and
            if stop in values:
                return stop
            if all(v is (not stop) for v in values):
                return not stop
        return None

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        value = self.decided(node)
        if value is not None:
            return ast.Constant(value)
        skip = isinstance(node.op, ast.And)  # operands that no longer matter: True in an and, False in an or
        node.values = [v for v in node.values if self.decided(v) is not skip]
        return node.values[0] if len(node.values) == 1 else node

    def visit_If(self, node):
        self.generic_visit(node)
        value = self.decided(node.test)
        if value is None:
            return node
        return (node.body if value else node.orelse) or None

    def visit_IfExp(self, node):
        self.generic_visit(node)
        value = self.decided(node.test)
        return node if value is None else (node.body if value else node.orelse)


def _roots_at(node, names: tuple[str, ...]) -> bool:
    """Whether ``node`` is one of the names, or a subscript or attribute of one (``stats["cut"][b]``)."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


class _Quiet(ast.NodeTransformer):
    """Leave out a loop's bookkeeping, which is not its lesson: imports inside the function, the timing (clock
    reads, ``marks()``, appends to ``*_ms`` lists, the ``Marks`` object) and the counters of a ``stats`` dict. A
    body left empty becomes ``pass``."""

    CLOCKS = ("perf_counter",)
    COUNTERS = ("stats", "marks")

    def _bookkeeping(self, node) -> bool:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Name) and f.id == "marks":
                return True
            if (isinstance(f, ast.Attribute) and f.attr == "append" and isinstance(f.value, ast.Name)
                    and f.value.id.endswith(("_ms", "_steps"))):
                return True
        if isinstance(node, ast.AugAssign) and _roots_at(node.target, self.COUNTERS):
            return True
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if _roots_at(target, self.COUNTERS):
                return True
            if (isinstance(target, ast.Name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr in self.CLOCKS):
                return True
        return False

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [s for s in stmts if not self._bookkeeping(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        return node


def resolved(fn, cfg, body_only: bool = True, quiet: bool = False) -> str:
    """``fn``'s source as configuration ``cfg`` runs it (its docstring left out): every test on ``cfg`` resolved
    (:class:`_Resolve`), the statements after a ``return``, ``continue`` or ``break`` dropped, and long lines cut
    (:func:`wrapped_line`); with ``body_only``, the body without its ``def`` line; with ``quiet``, the bookkeeping
    left out (:class:`_Quiet`). Printed from the syntax tree, so comments are left out too."""
    from book.common import without_docstrings

    tree = ast.parse(without_docstrings(textwrap.dedent(inspect.getsource(fn))))
    tree = _Resolve(cfg).visit(tree)
    if quiet:
        tree = _Quiet().visit(tree)
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            end = next((i for i, s in enumerate(stmts) if isinstance(s, (ast.Return, ast.Continue, ast.Break))),
                       len(stmts))
            del stmts[end + 1:]
    ast.fix_missing_locations(tree)
    fn_node = tree.body[0]
    text = "\n".join(ast.unparse(s) for s in fn_node.body) if body_only else ast.unparse(tree)
    return "\n".join(piece for line in text.splitlines() for piece in wrapped_line(line))


def wrapped_line(line: str, width: int = 100) -> list[str]:
    """One line of Python cut after ", " inside brackets so that each piece fits ``width`` where it can, each
    continuation indented under the bracket it is inside (strings are not cut)."""
    cuts, stack, quote = [], [], None  # cuts: (index after the ", ", index of the innermost open bracket)
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote and line[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            stack.append(i)
        elif ch in ")]}" and stack:
            stack.pop()
        elif ch == "," and stack and line[i + 1:i + 2] == " ":
            target = line.rfind(" for ", stack[-1], i)  # not inside a comprehension's "for a, b in"
            if target < 0 or " in " in line[target + 4:i]:
                cuts.append((i + 2, stack[-1]))
        elif ch == " " and stack and line.startswith((" for ", " else ", " if "), i):
            cuts.append((i + 1, stack[-1]))
    pieces = [(0, 0)]  # (index in the line where a piece starts, its indent)

    def column(index: int) -> int:
        start, indent = max(p for p in pieces if p[0] <= index)
        return index - start + indent

    while column(len(line)) > width:
        start = pieces[-1][0]
        fits = [(at, bracket) for at, bracket in cuts if at > start and column(at) - 1 <= width]
        if not fits:
            break
        at, bracket = fits[-1]
        pieces.append((at, column(bracket) + 1))
    out = []
    for k, (start, indent) in enumerate(pieces):
        end = pieces[k + 1][0] if k + 1 < len(pieces) else len(line)
        out.append((" " * indent + line[start:end]).rstrip())
    return out


def config_diff(fn, old_cfg, new_cfg, names: tuple[str, str], context: int = 2):
    """The diff (a ``studylog.source.Diff``) from ``fn`` as ``old_cfg`` runs it to ``fn`` as ``new_cfg`` runs it
    (:func:`resolved`, bodies only, the timing and counters left out)."""
    from studylog.source import Diff

    return Diff(resolved(fn, old_cfg, quiet=True), resolved(fn, new_cfg, quiet=True), *names, context)


__all__ = ["config_diff", "resolved", "wrapped_line"]
