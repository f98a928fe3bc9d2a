"""Integer bounds in JSON-schema regexes, which outlines-core ignores (for ``{"maximum": 9}`` a model may write
``10``). ``regex_from_schema(..., integer_bounds=True)`` puts them back: :func:`bound_integers` replaces every
bounded integer subschema by ``{"const": S}`` (``S`` a unique sentinel), outlines-core builds the regex, and
:func:`replace_sentinels` swaps each sentinel's digits for :func:`integer_range_regex` of its range."""

from __future__ import annotations

import copy
import json
import math
import numbers
import re
from typing import Any, Optional

#: The first sentinel: sixteen digits (below 2**53, so every JSON library keeps it exact) unlikely elsewhere.
SENTINEL_BASE = 7_361_000_000_000_000


def _cls(a: int, b: int) -> str:
    """One digit from ``a`` to ``b``."""
    if a == b:
        return str(a)
    if b == a + 1:
        return f"[{a}{b}]"
    return f"[{a}-{b}]"


def _any_digits(m: int, n: Optional[int]) -> str:
    """``m`` to ``n`` (None: any number of) digits."""
    if n is None:
        return {0: "[0-9]*", 1: "[0-9]+"}.get(m, f"[0-9]{{{m},}}")
    if m == n:
        return {0: "", 1: "[0-9]"}.get(m, f"[0-9]{{{m}}}")
    if (m, n) == (0, 1):
        return "[0-9]?"
    return f"[0-9]{{{m},{n}}}"


def _group(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _same_length(x: str, y: str) -> list[str]:
    """Alternatives matching exactly the digit strings from ``x`` to ``y`` (same length, ``x <= y``, leading zeros
    allowed: the tails of longer numbers)."""
    if x == y:
        return [x]
    i = next(i for i, (cx, cy) in enumerate(zip(x, y)) if cx != cy)
    prefix, a, b, xs, ys = x[:i], int(x[i]), int(y[i]), x[i + 1:], y[i + 1:]
    k = len(xs)
    out = []
    low_full, high_full = xs == "0" * k, ys == "9" * k
    if not low_full:  # a followed by xs..99..9
        out.append(str(a) + _group(_same_length(xs, "9" * k)))
    mid_a, mid_b = (a if low_full else a + 1), (b if high_full else b - 1)
    if mid_a <= mid_b:  # whole digits in between, any tail
        out.append(_cls(mid_a, mid_b) + _any_digits(k, k))
    if not high_full:  # b followed by 00..0..ys
        out.append(str(b) + _group(_same_length("0" * k, ys)))
    out.reverse()  # higher numbers first: it only reads better
    return [prefix + _group(out)] if prefix else out


def _natural_alternatives(a: int, b: Optional[int]) -> list[tuple[float, str]]:
    """``(longest match, regex)`` alternatives for the integers in ``[a, b]`` (``0 <= a``, ``b`` None: open), no
    leading zeros; consecutive lengths wholly in range merge into ``[1-9][0-9]{m,n}`` (open: ``{m,}``)."""
    la = len(str(a))
    lb = len(str(b)) if b is not None else la
    groups: list[tuple[int, object]] = []  # (length, "full" or [alternatives])
    for length in range(la, lb + 1):
        first = 10 ** (length - 1) if length > 1 else (0 if a == 0 else 1)
        lo = max(a, first)
        hi = 10 ** length - 1 if b is None else min(b, 10 ** length - 1)
        if lo > hi:
            continue
        full = lo == max(1, 10 ** (length - 1)) and hi == 10 ** length - 1
        groups.append((length, "full" if full else _same_length(str(lo), str(hi))))
    out: list[tuple[float, str]] = []
    run: Optional[list[int]] = None  # [first length, last length] of consecutive full lengths
    for length, g in groups + ([(lb + 1, "open")] if b is None else []) + [(0, [])]:  # the empty group ends a run
        if g in ("full", "open"):  # the run goes on to this length (open: to any length)
            run = [length if run is None else run[0], None if g == "open" else length]
            continue
        if run is not None:
            last = run[1]
            out.append((math.inf if last is None else last,
                        "[1-9]" + _any_digits(run[0] - 1, None if last is None else last - 1)))
            run = None
        out.extend((length, alt) for alt in g)
    out.sort(key=lambda t: -t[0])  # stable: longest first
    return out


def integer_range_regex(lo: Optional[int], hi: Optional[int]) -> str:
    """A regex matching exactly the integers in ``[lo, hi]`` as JSON writes them (``None``: open): a top-level
    alternation (not wrapped), longer branches first; no leading zeros, no ``+``, no ``-0``."""
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise TypeError(f"{name} must be an int or None, got {type(v).__name__}")
    lo, hi = (None if v is None else int(v) for v in (lo, hi))
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]: no integer is allowed")
    alts: list[tuple[float, str]] = []
    if lo is None or lo < 0:  # negatives: '-' and a magnitude in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= -1 else -hi
        m_hi = None if lo is None else -lo
        neg = _natural_alternatives(m_lo, m_hi)
        alts.append((1 + max(n for n, _ in neg), "-" + _group([r for _, r in neg])))
    if hi is None or hi >= 0:
        alts.extend(_natural_alternatives(0 if lo is None else max(lo, 0), hi))
    alts.sort(key=lambda t: -t[0])  # stable: longest first
    return "|".join(r for _, r in alts)


def _number(value: Any, where: str, key: str):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be finite, got {value!r}")
    return value


def integer_bounds(schema: dict, where: str = "#") -> tuple[Optional[int], Optional[int]]:
    """The integers ``[lo, hi]`` a subschema's bounds allow (None: open), rounded inward (``minimum: 1.5`` and
    ``exclusiveMinimum: 1`` are 2); draft 4's boolean exclusive forms are honoured."""
    lows, highs = [], []
    excl_min, excl_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if "minimum" in schema:
        v = _number(schema["minimum"], where, "minimum")
        lows.append(math.floor(v) + 1 if excl_min is True else math.ceil(v))
    if "maximum" in schema:
        v = _number(schema["maximum"], where, "maximum")
        highs.append(math.ceil(v) - 1 if excl_max is True else math.floor(v))
    if excl_min is not None and not isinstance(excl_min, bool):
        lows.append(math.floor(_number(excl_min, where, "exclusiveMinimum")) + 1)
    if excl_max is not None and not isinstance(excl_max, bool):
        highs.append(math.ceil(_number(excl_max, where, "exclusiveMaximum")) - 1)
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _resolve_pointer(root: Any, ref: str) -> Optional[Any]:
    """The target of a local ``$ref`` (``#``, ``#/$defs/Name``...), None when it is not local or not there."""
    if not isinstance(ref, str):
        return None
    base, _, fragment = ref.partition("#")
    if base and not (isinstance(root, dict) and root.get("$id") == base):
        return None
    node = root
    for part in (p for p in fragment.split("/") if p):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def bound_integers(schema: dict) -> tuple[dict, dict[str, str]]:
    """A copy of ``schema`` with every bounded integer subschema that outlines-core writes replaced by ``{"const":
    S}`` (with the other types of a ``type`` list: ``{"anyOf": [{"const": S}, <the others>]}``), and the map
    ``{str(S): "(?:range regex)"}``."""
    if not isinstance(schema, dict):
        raise TypeError(f"schema must be a dict, got {type(schema).__name__}")
    root, text, base = copy.deepcopy(schema), json.dumps(schema), SENTINEL_BASE
    while str(base)[:10] in text:  # all sentinels of one base share these ten digits: none may occur in the schema
        base += 10 ** 12
    mapping: dict[str, str] = {}
    seen: set[int] = set()

    def rewrite(node: dict, where: str) -> None:
        lo, hi = integer_bounds(node, where)
        try:
            body = integer_range_regex(lo, hi)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        sentinel = base + len(mapping)
        mapping[str(sentinel)] = f"(?:{body})"
        types = node["type"]
        others = [t for t in types if t != "integer"] if isinstance(types, list) else []
        keep = {k: node[k] for k in ("$defs", "definitions", "$id") if k in node}
        rest = {k: v for k, v in node.items() if k not in keep}
        node.clear()
        node.update(keep)
        if others:
            other = dict(rest, type=others[0] if len(others) == 1 else others)
            node["anyOf"] = [{"const": sentinel}, other]
            visit(other, where + "/anyOf/1")
        else:
            node["const"] = sentinel

    def visit(node: Any, where: str) -> None:  # in outlines-core's dispatch order (parsing.rs, ``to_regex``)
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        if "properties" in node:
            props = node["properties"]
            if isinstance(props, dict):
                for name, sub in props.items():
                    visit(sub, f"{where}/properties/{name}")
            return
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            if key in node:
                if isinstance(node[key], list):
                    for i, sub in enumerate(node[key]):
                        visit(sub, f"{where}/{key}/{i}")
                return
        if "enum" in node or "const" in node:
            return
        if "$ref" in node:
            target = _resolve_pointer(root, node["$ref"])
            visit(target, str(node["$ref"]))
            return
        t = node.get("type")
        types = t if isinstance(t, list) else [t]
        if "integer" in types and integer_bounds(node, where) != (None, None):
            rewrite(node, where)
            return
        if "array" in types and node.get("maxItems", 1) != 0:
            visit(node.get("items"), where + "/items")
        if "object" in types and node.get("maxProperties", 1) != 0:
            visit(node.get("additionalProperties"), where + "/additionalProperties")

    visit(root, "#")
    return root, mapping


def replace_sentinels(regex: str, mapping: dict[str, str]) -> str:
    """``regex`` with each sentinel's digits replaced by its range regex; a sentinel missing or inside a longer
    literal raises ValueError (never missed silently)."""
    for digits, replacement in mapping.items():
        hits = [m.start() for m in re.finditer(re.escape(digits), regex)]
        if not hits:
            raise ValueError(f"sentinel {digits} (for {replacement}) does not occur in the regex: outlines-core "
                             "did not write its subschema, or wrote the integer differently")
        for at in hits:
            before, after = regex[at - 1:at], regex[at + len(digits):at + len(digits) + 1]
            if before.isdigit() or before == "-" or after.isdigit():
                raise ValueError(f"sentinel {digits} occurs at {at} inside a longer literal "
                                 f"({regex[max(0, at - 10):at + len(digits) + 10]!r})")
    for digits, replacement in mapping.items():
        regex = regex.replace(digits, replacement)
    if left := [d for d in mapping if d in regex]:  # a replacement that contains another sentinel's digits
        raise ValueError(f"sentinels {left} remain in the regex after replacement")
    return regex

