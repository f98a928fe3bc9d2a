"""What outlines' Unicode ``\\d`` costs a date field, beside the ASCII class ``[0-9]`` the chapter compiles.

Run from the repository root: ``python lab/fsm/unicode_digits.py``. CPU only, about ten seconds (the
cl100k_base vocabulary and six outlines-core indexes). Uses only the package's public API.
"""

import numpy as np

from studylog import fsm
from studylog.fsm import schemas


def extra_tokens(wide, narrow, ids) -> list[np.ndarray]:
    """Walk ``ids`` through two automata of one vocabulary, ``narrow`` accepting a subset of ``wide``'s texts:
    for each state on the way (start to after the last token), the ids ``wide`` allows and ``narrow`` does not."""
    return [np.setdiff1d(wide.allowed_array(s), narrow.allowed_array(t))
            for s, t in zip(wide.walk(ids), narrow.walk(ids), strict=True)]


def main() -> None:
    vocab = fsm.load_vocabulary()
    date_schema = {"type": "string", "format": "date"}
    ascii_date = fsm.compile_fsm(fsm.regex_from_schema(date_schema), vocab, name="date, [0-9]")
    unicode_date = fsm.compile_fsm(fsm.regex_from_schema(date_schema, ascii_digits=False), vocab,
                                   name="date, Unicode \\d")
    nag_mundari = '"206\U0001E4F2-02-04"'  # U+1E4F2, the Nag Mundari digit two
    for automaton in (unicode_date, ascii_date):
        print(f"{automaton.name:>16}: {len(automaton.states):3d} states, accepts {nag_mundari}: "
              f"{automaton.matches(nag_mundari)}")

    date = '"2024-02-29"'
    ids = vocab.encode(date)
    extra = extra_tokens(unicode_date, ascii_date, ids)
    print("| state after | allowed with [0-9] | allowed with Unicode \\d | extra tokens |")
    for written, s, t, e in zip(["(start)"] + [vocab.show(i) for i in ids], unicode_date.walk(ids),
                                ascii_date.walk(ids), extra):
        print(f"| {written} | {ascii_date.n_allowed(t):,} | {unicode_date.n_allowed(s):,} | {e.size} |")
    first = next(e for e in extra if e.size)
    print(f"along {date}: {sum(e.size for e in extra)} extra mask entries; where the year begins, "
          f"{first.size} extra tokens: {' '.join(vocab.show(int(t)) for t in first)}")

    for name in ("tool_call", "calendar_event", "datetime"):
        entry = schemas.entry(name)
        sizes = [len(fsm.compile_fsm(entry.regex(ascii_digits=d), vocab).states) for d in (False, True)]
        print(f"{name}: {sizes[0]} states with Unicode \\d, {sizes[1]} with [0-9]")


if __name__ == "__main__":
    main()
