"""Tables and drawings of an automaton for the notebook: its states, a decode's events, the graph.

:func:`draw_automaton` uses matplotlib only (it renders offline): states sit at their distance in bytes from
the start, forced jumps are orange, final states have a double ring.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from book.fsm.events import RecordedDecode
from studylog.fsm.automaton import ConstrainedFSM, Jump
from studylog.fsm.vocabulary import TokenVocabulary


def _md(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _token_order(fsm: ConstrainedFSM) -> list[int]:
    """The token-level automaton's states in order of distance (in tokens) from the start."""
    order, seen, frontier = [], {fsm.initial}, [fsm.initial]
    while frontier:
        nxt = []
        for s in frontier:
            order.append(s)
            for t in fsm.index.get_allowed_tokens(s) or []:
                n = fsm.index.get_next_state(s, t)
                if n is not None and n not in seen:
                    seen.add(n)
                    nxt.append(n)
        frontier = sorted(nxt)
    return order


def state_names(fsm: ConstrainedFSM) -> dict[int, str]:
    """One name per state, shared by :func:`state_table` and :func:`draw_automaton`: ``q0`` is the start, the
    token-level automaton's states follow in the table's order, then the states only the character-level
    automaton has (the two share state ids)."""
    order = _token_order(fsm)
    seen, frontier = set(order), list(order)
    while frontier:
        nxt = []
        for s in frontier:
            for _, n in sorted(fsm.char_out.get(s, {}).items()):
                if n not in seen:
                    seen.add(n)
                    order.append(n)
                    nxt.append(n)
        frontier = nxt
    return {s: f"q{i}" for i, s in enumerate(order)}


def state_table(fsm: ConstrainedFSM, max_tokens: int = 8) -> str:
    """Markdown: each state (in order of distance from the start), its allowed tokens, forced or not."""
    names = state_names(fsm)
    order = _token_order(fsm)
    lines = ["| state | final | allowed | tokens | token jump from here |", "|---|---|---|---|---|"]
    for s in order:
        ids = fsm.allowed(s).tolist()
        shown = ", ".join(_md(fsm.vocab.show(t)) for t in sorted(ids, key=lambda t: fsm.vocab.show(t))[:max_tokens])
        if len(ids) > max_tokens:
            shown += f", … (+{len(ids) - max_tokens})"
        jump = fsm.token_jumps.get(s)
        jump_txt = " ".join(_md(fsm.vocab.show(t)) for t in jump.tokens) + f" → {names[jump.end]}" if jump else ""
        lines.append(f"| {names[s]} | {'yes' if fsm.is_final(s) else ''} | {len(ids)} | {shown} | {jump_txt} |")
    return "\n".join(lines)


def events_table(result: RecordedDecode, vocab: TokenVocabulary, start: int = 0, stop: Optional[int] = None) -> str:
    """Markdown: the events ``start`` to ``stop`` (excluded) of a decode recorded by :func:`book.fsm.events.record`;
    the passes are counted from the first event, so a table of the later rows continues the first one's."""
    lines = ["| # | event | tokens appended | replaced tokens | passes so far |", "|---|---|---|---|---|"]
    passes = 0
    for i, s in enumerate(result.events):
        passes += s.kind in ("pass", "eos")
        if i < start or (stop is not None and i >= stop):
            continue
        toks = " ".join(_md(vocab.show(t)) for t in s.tokens)
        lines.append(f"| {i} | {s.kind} | {toks} | {s.dropped or ''} | {passes} |")
    return "\n".join(lines)


# --- figures --------------------------------------------------------------------------------------------

def _label(items: list[str], max_items: int, pack: bool = False) -> str:
    """At most ``max_items`` of an edge's labels, one a line, then how many more; ``pack``: in about as many lines as
    columns (five labels in three lines of two), so a long list does not stand as a tall box over the other edges."""
    shown = items[:max_items]
    more = len(items) - len(shown)
    per_line = 1
    if pack and len(shown) > 2:
        per_line = math.ceil(len(shown) / math.ceil(math.sqrt(len(shown))))
    lines = ["  ".join(shown[i:i + per_line]) for i in range(0, len(shown), per_line)]
    return "\n".join(lines) + (f"\n+{more} more" if more > 0 else "")


def automaton_graph(fsm: ConstrainedFSM, level: Literal["token", "char"] = "token", compressed: bool = False,
                    max_edges: int = 5000):
    """The automaton as a ``networkx.DiGraph`` (EOS edges left out; ``final``/``initial`` node flags).

    Edges with the same ends are merged: ``labels`` lists what each writes, ``nbytes`` how many bytes the
    longest writes, ``jump`` whether a forced jump is part of it. Compressed, a forced chain is folded into
    the edge that reaches it: the label ``N[A"]`` means "a pass picks ``N``, then ``A"`` is appended without
    one"."""
    import networkx as nx

    vocab = fsm.vocab
    jumps = fsm.token_jumps if level == "token" else fsm.char_jumps
    if level == "token":
        trans, n_edges = {}, 0
        for s in fsm.states:
            ids = fsm.index.get_allowed_tokens(s) or []
            n_edges += len(ids)
            if n_edges > max_edges:
                raise ValueError(f"{fsm.name!r} has more than {max_edges} token edges; too many to draw")
            trans[s] = {t: fsm.index.get_next_state(s, t) for t in ids if t != vocab.eos_id}
        text = {s: {t: (vocab.show(t), len(vocab.token_bytes[t])) for t in d} for s, d in trans.items()}
    else:
        trans = fsm.char_out
        text = {s: {b: (bytes([b]).decode("latin-1").replace(" ", "␣"), 1) for b in d} for s, d in trans.items()}

    def jump_text(j: Jump) -> str:
        if level == "token":
            return "·".join(vocab.show(t) for t in j.tokens)
        return j.data.decode("utf-8", errors="backslashreplace").replace(" ", "␣")

    g = nx.DiGraph()
    todo, seen = [fsm.initial], {fsm.initial}
    while todo:
        u = todo.pop()
        g.add_node(u, final=u in fsm.finals, initial=u == fsm.initial)
        if compressed and u in jumps:  # only the start state can be forced and still be drawn
            j = jumps[u]
            edges = [(j.end, f"[{jump_text(j)}]", len(j.data), True)]
        else:
            edges = []
            for key, v in trans.get(u, {}).items():
                lab, nb = text[u][key]
                if compressed and v in jumps:
                    j = jumps[v]
                    edges.append((j.end, f"{lab}[{jump_text(j)}]", nb + len(j.data), True))
                else:
                    edges.append((v, lab, nb, False))
        for v, lab, nb, is_jump in edges:
            if g.has_edge(u, v):
                d = g.edges[u, v]
                d["labels"].append(lab)
                d["nbytes"] = max(d["nbytes"], nb)
                d["jump"] = d["jump"] or is_jump
            else:
                g.add_edge(u, v, labels=[lab], nbytes=nb, jump=is_jump)
            if v not in seen:
                seen.add(v)
                todo.append(v)
    for *_, d in g.edges(data=True):
        d["labels"].sort(key=lambda x: (len(x), x))
    return g


def _layout(g, initial: int, by_bytes: bool = True, gap: float = 1.6) -> dict[int, tuple[float, float]]:
    """x: the longest distance from the start, in bytes (a token spans as many columns as it has bytes)
    or in edges; y: a state stays on the row of its nearest predecessor (the one in the latest column), so
    each spelling of a word runs along one row and its longer tokens arc over it; states that would share a
    spot in a column are pushed ``gap`` apart. Falls back to hop counts when the graph has cycles."""
    import networkx as nx

    dag = nx.DiGraph((u, v, d) for u, v, d in g.edges(data=True) if u != v)
    dag.add_nodes_from(g.nodes)
    if nx.is_directed_acyclic_graph(dag):
        x = {n: 0 for n in g.nodes}
        for n in nx.topological_sort(dag):
            for _, v, d in dag.out_edges(n, data=True):
                x[v] = max(x[v], x[n] + (d["nbytes"] if by_bytes else 1))
    else:
        x = dict(nx.single_source_shortest_path_length(dag, initial))
        for n in g.nodes:
            x.setdefault(n, max(x.values()) + 1)
    y: dict[int, float] = {}
    for col in sorted(set(x.values())):
        nodes = [n for n in g.nodes if x[n] == col]

        def wanted(n):
            preds = [p for p in g.predecessors(n) if p in y]
            if not preds:
                return 0.0
            last = max(x[p] for p in preds)
            near = [y[p] for p in preds if x[p] == last]
            return sum(near) / len(near)

        # ties (siblings that all want their parent's row) go to the one with the most edges first (top)
        nodes.sort(key=lambda n: (-wanted(n), -g.out_degree(n), n))
        want = [wanted(n) for n in nodes]
        groups: list[list[int]] = []  # runs of states closer than `gap`, each spread evenly around its mean
        for i in range(len(nodes)):
            if groups and want[groups[-1][-1]] - want[i] < gap:
                groups[-1].append(i)
            else:
                groups.append([i])
        for grp in groups:
            mid = sum(want[i] for i in grp) / len(grp)
            if len({want[i] for i in grp}) == 1:  # siblings: the most branching ones on the outside, where
                grp = _outside_in(grp)  # their arcs bend away from the others
            for k, i in enumerate(grp):
                y[nodes[i]] = mid + gap * ((len(grp) - 1) / 2 - k)
    return {n: (float(x[n]), y[n]) for n in g.nodes}


def _outside_in(items: list) -> list:
    """``items`` (most important first) arranged from the top down: first at the top, second at the bottom,
    third below the first, and so on, so the last ones end in the middle."""
    top, bottom = [], []
    for i, item in enumerate(items):
        if i % 2 == 0:
            top.append(item)
        else:
            bottom.insert(0, item)
    return top + bottom


def _passes_near(pos: dict, u: int, v: int, dist: float) -> bool:
    """Whether the segment from u to v passes within ``dist`` of a third state."""
    (x0, y0), (x1, y1) = pos[u], pos[v]
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    for n, (x, y) in pos.items():
        if n in (u, v) or length2 == 0:
            continue
        t = ((x - x0) * dx + (y - y0) * dy) / length2
        if 0 < t < 1 and (x0 + t * dx - x) ** 2 + (y0 + t * dy - y) ** 2 < dist * dist:
            return True
    return False


def _label_box(text: str, inches: float) -> tuple[float, float]:
    """A label's width and height in drawing units, where one unit is drawn ``inches`` wide: 7.5-point
    monospace (0.6 em a character, 1.2 em a line) with its padding and a small margin."""
    lines = text.split("\n")
    char, line = 0.6 * 7.5 / 72, 1.2 * 7.5 / 72
    return (char * max(len(line) for line in lines) + 0.12) / inches, (line * len(lines) + 0.1) / inches


def _label_spot(point, first: float, box: tuple[float, float], states: list[tuple[float, float]],
                placed: list[tuple[float, float, float, float]], r: float,
                curves: tuple[tuple[float, float], ...] = (), margin: float = 0.06) -> tuple[float, float]:
    """Where an edge's label goes: the first point along the edge (``point(t)``, t from 0 to 1, starting at
    ``first`` and moving out) where its ``box`` keeps clear of every state's circle, of the labels already
    ``placed`` (x, y, width, height) and of the other edges' ``curves`` (points sampled along them, kept ``margin``
    away, so a drawn line does not touch the box), then the
    same points moved up or down by half the box, so the box touches its edge. A state or a
    label is never covered where some point allows it, so no label hides a state's name or another label; among
    those points, the one farthest from the other edges is taken when none clears them all."""
    w, h = box
    best, best_score = point(first), (False, -1e9)
    ts = (first, 0.5, 0.4, 0.6, 0.3, 0.7, 0.35, 0.65, 0.25, 0.75, 0.2, 0.8, 0.15, 0.85)
    # on the edge first; then just above or below it, the box's edge touching the curve, so it still reads as
    # the edge's label
    for t, shift in [(t, 0.0) for t in ts] + [(t, s * (h / 2 + 0.04)) for t in ts for s in (1, -1)]:
        x, y = point(t)
        y += shift
        to_state = min(((max(abs(x - sx) - w / 2, 0)) ** 2 + (max(abs(y - sy) - h / 2, 0)) ** 2) ** 0.5
                       for sx, sy in states) - (r + 0.05)
        to_label = min((max(abs(x - px) - (w + pw) / 2, abs(y - py) - (h + ph) / 2) for px, py, pw, ph in placed),
                       default=1.0)
        to_curve = min((max(abs(x - cx) - w / 2, abs(y - cy) - h / 2) for cx, cy in curves), default=1.0)
        hard = min(to_state, to_label)
        if hard >= 0 and to_curve >= margin:  # a gap a line's width could not close
            return x, y
        score = (hard >= 0, min(hard, to_curve) if hard >= 0 else hard)
        if score > best_score:
            best, best_score = (x, y), score
    return best


def _clearance(pos: dict, u: int, v: int, rad: float) -> float:
    """The least distance from the arc3 curve from u to v (bent by ``rad``) to a third state's centre."""
    (x0, y0), (x1, y1) = pos[u], pos[v]
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    least = float("inf")
    for i in range(1, 40):
        t = i / 40
        x = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t * t * x1
        y = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1
        for n, (sx, sy) in pos.items():
            if n not in (u, v):
                least = min(least, ((x - sx) ** 2 + (y - sy) ** 2) ** 0.5)
    return least


def draw_automaton(fsm: ConstrainedFSM, level: Literal["token", "char"] = "token", compressed: bool = False,
                   ax=None, max_labels: Optional[int] = None, title: Optional[str] = None):
    """Draw the automaton with matplotlib only (renders offline). States sit at their distance in bytes
    from the start (in edges when compressed); forced jumps are orange; final states have a double ring.
    An edge's label lists at most ``max_labels`` of what it writes (default: 4, and 2 compressed, where merged
    edges carry longer labels), then how many more."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyArrowPatch

    if max_labels is None:
        max_labels = 2 if compressed else 4
    g = automaton_graph(fsm, level, compressed)
    pos = _layout(g, fsm.initial, by_bytes=not compressed)
    if compressed:
        pos = {n: (1.5 * x, y) for n, (x, y) in pos.items()}  # room for longer labels, still legible at page width
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    # the limits: the states with room for the start arrow, and for the arcs' labels above and below
    x_range, y_range = max(xs) - min(xs) + 1.5, max(ys) - min(ys) + 2.5
    if ax is None:  # a figure of the drawing's own shape, so equal aspect leaves no wide empty margins
        unit = min(1.1, 15.0 / x_range)
        fig, ax = plt.subplots(figsize=(unit * x_range + 0.2, unit * y_range + 0.6))
        fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - 0.45 / (unit * y_range + 0.6))
    # how wide one unit is drawn (the axes hold the limits at equal aspect): the labels' boxes are sized in it
    box = ax.get_position()
    inches = min(ax.figure.get_figwidth() * box.width / x_range, ax.figure.get_figheight() * box.height / y_range)
    sx = 1.0  # one byte = one unit
    r = 0.22
    names = state_names(fsm)  # the names of state_table, so the drawing and the table agree
    for n in g.nodes:
        x, y = pos[n]
        ax.add_patch(Circle((x * sx, y), r, fc="#e8eef7", ec="#33414f", lw=1.2, zorder=3))
        if g.nodes[n]["final"]:
            ax.add_patch(Circle((x * sx, y), r * 0.8, fc="none", ec="#33414f", lw=1.0, zorder=4))
        ax.text(x * sx, y, names.get(n, str(n)), ha="center", va="center", fontsize=8.5, zorder=5)
    # first every edge's curve, then the labels, so a label can keep clear of the edges drawn after it too
    curves = []  # per edge: (patch, its label's t to start from, point(t), points sampled along it)
    for k, (u, v, d) in enumerate(g.edges(data=True)):
        (x0, y0), (x1, y1) = pos[u], pos[v]
        color = "#d9730d" if d["jump"] else "#33414f"
        if u == v:
            patch = FancyArrowPatch((x0 * sx - 0.1, y0 + r), (x0 * sx + 0.1, y0 + r), connectionstyle="arc3,rad=-2.5",
                                    arrowstyle="-|>", mutation_scale=10, color=color, lw=1.0)
            curves.append((patch, None, None, ()))
            continue
        dx, dy = (x1 - x0) * sx, y1 - y0
        rad = 0.0
        if g.has_edge(v, u):
            rad = 0.25
        elif _passes_near(pos, u, v, r * 1.5):  # a straight line would run through another state: bend,
            # away from the middle first (arc3: rad < 0 bends up, left to right); at a fixed rad an arc's height
            # grows with its span, so the arcs over one row nest and their labels stack
            away = -1.0 if (y0 + y1) / 2 >= 0 else 1.0
            if dx < 0:
                away = -away
            tries = [away * k for k in (0.4, 0.25, 0.6)] + [-away * k for k in (0.12, 0.25, 0.4, 0.6)]
            clear = [c for c in tries if _clearance(pos, u, v, c) >= r * 1.6]
            rad = clear[0] if clear else max(tries, key=lambda c: _clearance(pos, u, v, c))
        patch = FancyArrowPatch((x0 * sx, y0), (x1 * sx, y1), connectionstyle=f"arc3,rad={rad}",
                                arrowstyle="-|>", mutation_scale=11, color=color, lw=1.9 if d["jump"] else 1.1,
                                shrinkA=r * 72 * 0.9, shrinkB=r * 72 * 0.9)
        # matplotlib's arc3 curve is a quadratic Bézier through this control point (the segment when rad = 0)
        cx, cy = x0 * sx + dx / 2 + rad * dy, y0 + dy / 2 - rad * dx

        def point(t, x0=x0, y0=y0, x1=x1, y1=y1, cx=cx, cy=cy):
            return ((1 - t) ** 2 * x0 * sx + 2 * (1 - t) * t * cx + t * t * x1 * sx,
                    (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1)

        first = 0.5 if rad or abs(dx) <= 1.5 else 0.32 + 0.36 * ((k * 0.618) % 1.0)
        curves.append((patch, first, point, tuple(point(i / 40) for i in range(3, 38))))
    label_ys: list[float] = []
    placed: list[tuple[float, float, float, float]] = []  # the labels drawn so far, which the next keep clear of
    for k, (u, v, d) in enumerate(g.edges(data=True)):
        patch, first, point, _ = curves[k]
        text = _label(d["labels"], max_labels, pack=compressed)
        color = "#d9730d" if d["jump"] else "#33414f"
        if point is None:  # a loop on one state: its label above it
            lx, ly = pos[u][0] * sx, pos[u][1] + r + 0.35
        else:
            others = tuple(p for j, c in enumerate(curves) if j != k for p in c[3])
            lx, ly = _label_spot(point, first, _label_box(text, inches), [(px * sx, py) for px, py in pos.values()],
                                 placed, r, others)
        patch.set_zorder(2)
        ax.add_patch(patch)
        label_ys.append(ly)
        placed.append((lx, ly, *_label_box(text, inches)))
        ax.text(lx, ly, text, fontsize=7.5, ha="center", va="center", color=color,
                family="monospace", zorder=2.5,  # under the states: a label never hides a state's name
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec=color, lw=0.5))  # opaque: no curve shows through
    x0, y0 = pos[fsm.initial]
    ax.annotate("", xy=(x0 * sx - r, y0), xytext=(x0 * sx - r - 0.45, y0),
                arrowprops=dict(arrowstyle="-|>", lw=1.2, color="#33414f"))
    ax.set_xlim(min(xs) * sx - 0.9, max(xs) * sx + 0.6)
    ax.set_ylim(min(ys + label_ys) - 0.7, max(ys + label_ys) + 0.8)
    ax.set_aspect("equal")
    ax.set_axis_off()
    kind = {"token": "token-level", "char": "character-level"}[level]
    ax.set_title(title or f"{kind} automaton{' (compressed)' if compressed else ''}: {fsm.name}", fontsize=10)
    return ax
