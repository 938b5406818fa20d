"""Two runs of `warmpath eval --suite repo --out` side by side, hole by hole (the same holes in
both).

    python benchmarks/repo_compare.py A.json B.json [--by language|kind|language_kind|age]

Per group, for each run: exact as inserted, with the newline cut, first line right, latency p50; the
difference, and the paired counts (holes right only in A, only in B): a difference of a point on a
few hundred holes is a handful of holes, so the pairs say whether it is noise of the model's
near-ties or one direction."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from warmpath.stats import percentile


def key(r: dict) -> str:
    """A hole's id; runs before ids were unique named a `lines` hole without its line count."""
    if r["kind"] == "lines" and r["id"].endswith("/lines"):
        return r["id"] + str(r["middle"].count("\n") + 1)
    return r["id"]


def group_of(r: dict, by: str) -> str:
    if by == "language":
        return r["language"]
    if by == "kind":
        return r["kind"]
    if by == "age":
        return "since 2025" if r["since"] >= 2025 else "before 2025"
    return f"{r['language']}/{r['kind']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--by", default="language", choices=("language", "kind", "language_kind", "age"))
    p.add_argument("--slice", default="main", help="main, cross-file or cross-file+context")
    args = p.parse_args()
    runs = [json.load(open(f)) for f in (args.a, args.b)]
    a, b = ({key(r): r for r in run["results"] if r["slice"] == args.slice} for run in runs)
    common = [i for i in a if i in b]
    groups: dict[str, list[str]] = defaultdict(list)
    for i in common:
        groups["all"].append(i)
        groups[group_of(a[i], args.by)].append(i)
    print(f"A: {runs[0].get('label') or args.a} ({runs[0].get('model')}, {runs[0].get('client')})")
    print(f"B: {runs[1].get('label') or args.b} ({runs[1].get('model')}, {runs[1].get('client')})")
    print(
        "| group | holes | exact A | exact B | B - A | right only in A | only in B | newline cut A "
        "| newline cut B "
        "| first line A | first line B | p50 s A | p50 s B |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ["all", *sorted(g for g in groups if g != "all")]:
        ids = groups[name]
        n = len(ids)

        def share(run: dict, field: str) -> str:
            return f"{100 * sum(run[i][field] for i in ids) / n:.1f}%"  # noqa: B023 (used in this iteration)

        def p50(run: dict) -> str:
            return f"{percentile([run[i]['seconds'] for i in ids], 50):.2f}"  # noqa: B023
        diff = (sum(b[i]["exact"] for i in ids) - sum(a[i]["exact"] for i in ids)) / n
        only_a = sum(a[i]["exact"] and not b[i]["exact"] for i in ids)
        only_b = sum(b[i]["exact"] and not a[i]["exact"] for i in ids)
        print(
            f"| {name} | {n} | {share(a, 'exact')} | {share(b, 'exact')} | {100 * diff:+.1f} | "
            f"{only_a} | {only_b} "
            f"| {share(a, 'newline_cut')} | {share(b, 'newline_cut')} | {share(a, 'first_line')} | "
            f"{share(b, 'first_line')} | {p50(a)} | {p50(b)} |")

if __name__ == "__main__":
    main()
