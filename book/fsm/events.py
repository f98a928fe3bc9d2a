"""A decode's events, for the page's trace and the tests: what each forward pass picked, what each jump appended
(and how many emitted tokens a retokenization replaced), and how the decode ended.

The chapter's steps (``studylog.fsm.decode``) do not record them: :func:`record` watches a step from outside, through
the ``next_logits`` it calls, and rebuilds its events from the ids it is called with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import DecodeResult, NextLogits, check_logits, decode, greedy


@dataclass
class Event:
    """One event of a decode: a pass that picked ``tokens[0]``, a token jump, a character jump (``dropped``: emitted
    tokens that retokenization replaced), EOS, or the end (a state allowing only EOS, reached without a pass)."""

    kind: Literal["pass", "token-jump", "char-jump", "eos", "end"]
    tokens: tuple[int, ...] = ()
    data: bytes = b""
    dropped: int = 0


@dataclass
class RecordedDecode(DecodeResult):
    """A decode's result with its events, in order."""

    events: list[Event] = field(default_factory=list)


def _jump(kind: str, fsm: ConstrainedFSM, before: list[int], after: list[int]) -> Event:
    """The jump that turned the ids ``before`` into ``after``: the tokens after their common prefix, the bytes
    appended to the text, and the emitted tokens it replaced."""
    keep = 0
    while keep < min(len(before), len(after)) and before[keep] == after[keep]:
        keep += 1
    appended = fsm.vocab.decode(after)[len(fsm.vocab.decode(before)):]
    return Event(kind, tuple(after[keep:]), appended, dropped=len(before) - keep)


def record(next_logits: NextLogits, fsm: ConstrainedFSM, mode: str = "none", *, max_tokens: int = 256
           ) -> RecordedDecode:
    """:func:`studylog.fsm.decode` with its events: each call of ``next_logits`` is a pass, whose pick is the masked
    argmax the step takes (:func:`studylog.fsm.decoding.greedy` in the state its ids reach); ids that change between
    two passes are a jump (a step never jumps twice in a row: a jump ends where nothing more is forced)."""
    calls: list[tuple[list[int], int]] = []  # (the ids a pass was given, the token it picked)

    def watched(ids: list[int]):
        logits = next_logits(ids)
        tok = greedy(fsm, fsm.walk(ids)[-1], check_logits(logits, fsm.vocab.vocab_size))
        calls.append((list(ids), tok))
        return logits

    res = decode(watched, fsm, mode, max_tokens=max_tokens)
    kind = {"token": "token-jump", "char": "char-jump"}.get(mode)
    out = RecordedDecode(**{f: getattr(res, f) for f in DecodeResult.__dataclass_fields__})
    ids: list[int] = []
    for given, tok in calls:
        if given != ids:
            out.events.append(_jump(kind, fsm, ids, given))
        if tok == fsm.vocab.eos_id:
            out.events.append(Event("eos", (tok,)))
            ids = given
        else:
            out.events.append(Event("pass", (tok,), fsm.vocab.token_bytes[tok]))
            ids = given + [tok]
    if res.ids != ids:
        out.events.append(_jump(kind, fsm, ids, res.ids))
    if res.finished and not (out.events and out.events[-1].kind == "eos"):
        out.events.append(Event("end"))
    return out
