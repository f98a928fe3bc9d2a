"""Where xgrammar's or llguidance's masks differ from outlines-core's on the chapter's suite, and who is right.

Run from the repository root: ``python lab/fsm/peer_disagreements.py`` (needs the ``peers`` extra:
``pip install -e '.[peers]'``). CPU only, about a minute. Uses only the package's public API.

1. Every state of the suite's walks (default whitespace) where a peer's mask differs from ours while nothing
   is forced: the tokens only one side allows, judged by the ``regex`` module's partial match
   (``peers.viable_prefix``: can the text with that token still be completed into a match?).
2. Two regexes outside the suite where outlines-core drops a continuation at a point where the text may end.
"""

import numpy as np

from studylog import fsm
from book.fsm import peers
from studylog.fsm import schemas


def suite_disagreements(vocab) -> None:
    rows = peers.compare_peers(vocab=vocab, n_samples=8, seed=0)
    seen = set()
    for r in rows:
        for d in r.differences:
            key = (d.entry, d.library, d.ours, d.theirs)
            if d.what != "mask" or key in seen:
                continue
            seen.add(key)
            regex = schemas.entry(d.entry).regex()
            for side, ids in (("ours", d.ours), (d.library, d.theirs)):
                for t in ids:
                    ok = peers.viable_prefix(regex, d.prefix + vocab.token_bytes[t])
                    print(f"{d.entry}: after ...{d.prefix[-24:]!r} only {side} allows {vocab.token_bytes[t]!r}; "
                          f"the regex {'can' if ok else 'cannot'} be completed from there -> "
                          f"{side if ok else 'the other side'} is right")


def outlines_core_drops(vocab) -> None:
    libs = {name: peers.library(name, vocab) for name in peers.LIBRARIES}
    for regex, text, nxt in (("ab(cd)?", "ab", "c"), ("(yes|yes!)", "yes", "!")):
        verdict = {}
        for n, lib in libs.items():
            m = lib.matcher(lib.compile(regex))
            for t in vocab.encode(text):
                m.consume(t)
            words = np.zeros(peers.mask_words(vocab.vocab_size), dtype=np.int32)
            m.fill_mask(words)
            verdict[n] = bool(peers.unpack_mask(words, vocab.vocab_size)[vocab.token_id(nxt.encode())])
        print(f"{regex!r} after {text!r}, token {nxt!r} allowed: {verdict}; the regex module: "
              f"{'a match can follow' if peers.viable_prefix(regex, (text + nxt).encode()) else 'no match follows'}")


if __name__ == "__main__":
    vocabulary = fsm.load_vocabulary()
    suite_disagreements(vocabulary)
    outlines_core_drops(vocabulary)
