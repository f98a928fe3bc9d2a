"""Compare a fresh tails run with the committed one, row by row (``bench verify`` covers the chapters' files, not
the tails run): ``python lab/tails/compare.py NEW.json [OLD.json]`` prints a markdown table of p50 and p99 (µs)."""
import json
import sys
from pathlib import Path

new_path = Path(sys.argv[1])
old_path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("assets/bench/nvidia-h200/tails.json")
old, new = (json.loads(p.read_text()) for p in (old_path, new_path))


def key(row):
    return row["series"], json.dumps(row["params"], sort_keys=True)


before = {key(r): r for r in old["measurements"]}
print(f"{new_path} ({new.get('git_commit')}, {new.get('date')}) against {old_path} ({old.get('git_commit')}, "
      f"{old.get('date')})\n")
print("| series | case | p50 new | p99 new | p50 old | p99 old | p50 new / old |\n|---|---|---|---|---|---|---|")
for r in new["measurements"]:
    o = before.get(key(r))
    case = r["params"].get("shape") or ", ".join(f"{k} {v}" for k, v in r["params"].items())
    cells = [f"{r['p50_ms'] * 1e3:.2f}", f"{r['p99_ms'] * 1e3:.2f}"]
    cells += ([f"{o['p50_ms'] * 1e3:.2f}", f"{o['p99_ms'] * 1e3:.2f}", f"{r['p50_ms'] / o['p50_ms']:.3f}"] if o
              else ["new case", "", ""])
    print(f"| {r['series']} | {case} | " + " | ".join(cells) + " |")
