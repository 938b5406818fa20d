"""What a soak (soak.py) means: its summary, the verdict's rules, the table and the plot. The rules:

- client-visible errors: 0 (the flood's included);
- streams cut by the kills: at most what the killed node had in flight when it was killed;
- kills and restarts: as many kills as asked for, each node start after them (on the same tier) come
  up;
- KV blocks held at the end: 0 on either node, with no request running or waiting, and 0 in flight
  at the router;
- each tier within --kv-offload-bytes: at every sample, its blocks' files at most the bound plus one
  block (the writer renames a block in before it deletes the oldest);
- RSS flat: for each process's last life (the router's and node 0's are the whole run), from the end
  of its warm-up (a minute or a tenth of the run, the longer) to the end of the traffic: the largest
  RSS of the last third at most RSS_GROWTH times the largest of the first third. Judged without the
  two tables that grow to a size fixed by a flag, by design, and are measured apart: a node's KV
  pool's resident pages (`kv_resident_mb`: the pool is mapped from zero pages as its blocks are
  first written, models/kv_cache.py) and the router's prefix indexes (`prefix_index_mb`:
  --prefix-index-blocks a node, filled by every new prompt, as /metrics reports their size). A leak
  of a kilobyte a request over an hour's ~15,000 requests is 15 MB, 2% of a node and 20% of the
  router; tables keyed by session fill in the first third (the floods use the same session ids).
  Judged where that span is JUDGED_MINUTES or more: a shorter one cannot tell a leak from a warm-up.
  A node's malloc view is reported beside it (`heap_used_growth`, same windows): a leak grows what
  malloc has handed out, a heap kept large by glibc only its free part;
- answers: each check prompt's greedy tokens through the router after all this, and again with its
  prefix cached, equal a fresh server's.
"""

from __future__ import annotations

RSS_GROWTH = 1.05
JUDGED_MINUTES = 10.0


def lives(samples: list[dict], name: str) -> list[list[tuple[dict, dict]]]:
    """A process's samples (the sample, its row), split by process id: one list per life."""
    out: list[list[tuple[dict, dict]]] = []
    for s in samples:
        row = s["procs"].get(name)
        if row is None:
            continue
        if not out or out[-1][-1][1]["pid"] != row["pid"]:
            out.append([])
        out[-1].append((s, row))
    return out


def bounded_mb(row: dict) -> float:
    """The part of a process's RSS that fills to a flag's bound by design (see the RSS rule
    above)."""
    return (row.get("kv_resident_mb") or 0.0) + (row.get("prefix_index_mb") or 0.0)


def _growth(judged: list[tuple[float, float]]) -> tuple[float, float]:
    """The largest value of the last third of the span and of the first."""
    start, span = judged[0][0], judged[-1][0] - judged[0][0]
    return (max(m for t, m in judged
                if t <= start + span / 3), max(m for t, m in judged if t >= start + 2 * span / 3))


def rss_flat(samples: list[dict], name: str, run_s: float) -> dict:
    """The RSS rule on the process's last life."""
    life = lives(samples, name)[-1]
    warm = life[0][0]["t"] + max(60.0, 0.1 * run_s)
    traffic = [(s, row) for s, row in life if warm <= s["t"] <= run_s]
    judged = [(s["t"], row["rss_mb"] - bounded_mb(row)) for s, row in traffic]
    span = judged[-1][0] - judged[0][0] if judged else 0.0
    if span < JUDGED_MINUTES * 60:
        return {"ok": None, "span_min": round(span / 60, 1)}
    first, last = _growth(judged)
    out = {
        "ok": last <= RSS_GROWTH * first, "span_min": round(span / 60,
                                                            1), "first_third_max_mb": first,
        "last_third_max_mb": last, "growth": round(last / first - 1, 4)
    }
    heap = [(s["t"], s["nodes"][name]["heap_used_mb"]) for s, _ in traffic
            if (s["nodes"].get(name) or {}).get("heap_used_mb") is not None]
    if len(heap) >= 3 and heap[-1][0] - heap[0][0] >= span / 2:
        used_first, used_last = _growth(heap)
        out |= {
            "heap_used_first_third_max_mb": used_first, "heap_used_last_third_max_mb": used_last,
            "heap_used_growth": round(used_last / used_first - 1, 4)
        }
    return out


def tier_summary(samples: list[dict], node: str, bound: int) -> dict:
    rows = [s["tiers"][node] for s in samples]
    over = [r["kv_bytes"] - r["largest_file"] - bound for r in rows]
    # a counter per life
    hits = sum(max((s["nodes"][node] or {}).get("tier_hit_tokens", 0) for s, _ in life)
               for life in lives(samples, node))
    return {
        "max_mb": round(max(r["kv_bytes"] for r in rows) / 1e6,
                        1), "end_mb": round(rows[-1]["kv_bytes"] / 1e6,
                                            1), "bound_mb": round(bound / 1e6, 1),
        "block_mb": round(max(r["largest_file"] for r in rows) / 1e6, 2), "within_bound": max(over)
        <= 0, "max_tmp_files": max(r["tmp_files"] for r in rows), "tier_hit_tokens": int(hits)
    }


def summarize(result: dict) -> dict:
    samples, summary = result["samples"], {"procs": {}}
    for name in samples[0]["procs"]:
        rows = [s["procs"][name] for s in samples if s["procs"].get(name)]
        summary["procs"][name] = {
            k: {"start": rows[0][k], "end": rows[-1][k], "max": max(r[k] for r in rows)}
            for k in ("rss_mb", "fds", "threads")
        }
        summary["procs"][name]["rss_rule"] = rss_flat(samples, name, result["minutes"] * 60)
    summary["tiers"] = {
        n: tier_summary(samples, n, result["kv_offload_bytes"])
        for n in samples[0]["tiers"]
    }
    final = samples[-1]
    summary["end"] = {"nodes": final["nodes"], "router_in_flight": final["router_in_flight"]}
    return summary


def same_answers(router: list[dict], fresh: list[dict]) -> list[bool]:
    return [("error" not in r and "error" not in f and
             (r["text"], r["tokens"]) == (f["text"], f["tokens"]))
            for r, f in zip(router, fresh, strict=True)]


def verdict(result: dict) -> dict[str, dict]:
    """Each rule's outcome: ok True / False, or None where it is not judged (a run too short), and
    its value."""
    s, c, f = result["summary"], result["counts"], result["flood"]
    errors, cut = c["errors"] + f["errors"], c["cut_by_kill"] + f["cut_by_kill"]
    could_cut = sum(k["in_flight"] for k in result["kills"])
    end = s["end"]["nodes"].values()
    held = [None if n is None else n["kv_blocks_used"] for n in end]
    idle = all(n is not None and n["kv_blocks_used"] == n["running"] == n["waiting"] == 0
               for n in end)
    rss = {name: p["rss_rule"] for name, p in s["procs"].items()}
    judged = [r["ok"] for r in rss.values() if r["ok"] is not None]
    failed = [e for e in result["events"] if "failed" in e]
    got = result["answers"]
    same = same_answers(got["router"], got["fresh"]) + same_answers(got["router_again"],
                                                                    got["fresh"])
    return {
        "client-visible errors": {"ok": errors == 0, "value": errors},
        "streams cut by the kills": {
            "ok": cut <= could_cut, "value": f"{cut} (the killed node had {could_cut} "
            "in flight)"
        },
        "kills and restarts": {
            "ok": len(result["kills"]) == result["kills_asked"] and not failed,
            "value": f"{len(result['kills'])} kills, {result['restarts']} drained restarts" +
            "".join(f"; {e['what']} failed: {e['failed']}" for e in failed)
        },
        "KV blocks held at the end": {
            "ok": idle and s["end"]["router_in_flight"] == 0,
            "value": f"{held}, router in flight {s['end']['router_in_flight']}"
        },
        "tier within --kv-offload-bytes": {
            "ok": all(t["within_bound"] for t in s["tiers"].values()), "value": {
                n: f"max {t['max_mb']} MB, bound {t['bound_mb']} + a block "
                f"{t['block_mb']}"
                for n, t in s["tiers"].items()
            }
        },
        "RSS flat": {
            "ok": all(judged) if judged else None, "value": {
                n: r.get("growth", f"not judged ({r['span_min']} min)")
                for n, r in rss.items()
            }
        },
        "answers identical to a fresh server's": {
            "ok": all(same), "value": f"{sum(same)} of {len(same)}"
        },
    }


def table(result: dict) -> str:
    s, lines = result["summary"], ["| process | RSS MB start / end / max | fds start / end / max | "
                                   "threads start / end / max |", "|---|---|---|---|"]
    for name, v in s["procs"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v[k]['start']} / {v[k]['end']} / {v[k]['max']}"
                                                  for k in ("rss_mb", "fds", "threads")) + " |")
    c, f = result["counts"], result["flood"]
    lines.append(
        f"\n{result['minutes']} min, node 1 killed {len(result['kills'])}x and restarted drained "
        f"{result['restarts']}x; requests {c['sent']}: ok {c['ok']}, silence {c['silence']}, "
        "client "
        f"disconnects {c['disconnected']}, cut by a kill {c['cut_by_kill']}, client-visible errors "
        f"{c['errors']}; flood {f['sent']}: silence {f['silence']}, hung up {f['hung_up']}, errors "
        f"{f['errors']}; the nodes idle {result['drained_s']} s after the traffic stopped")
    for node, t in s["tiers"].items():
        lines.append(
            f"{node} tier: max {t['max_mb']} MB, end {t['end_mb']} MB of {t['bound_mb']}; "
            f"{t['tier_hit_tokens']} prompt tokens read back; temporary files at most "
            f"{t['max_tmp_files']}"
        )
    for when in ("router", "router_again"):
        got = result["answers"][when]
        lines.append(
            f"check prompts through the router at the end{', again' if when != 'router' else ''}: "
            f"{sum(x.get('cached') or 0 for x in got)} prompt tokens cached, "
            f"{sum(x.get('tier') or 0 for x in got)} of them read back from a tier")
    lines.append("\nverdict:")
    for rule, v in result["verdict"].items():
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[v["ok"]]
        lines.append(f"  {mark} {rule}: {v['value']}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(6, 1, figsize=(9, 15.5), sharex=True)
    for ax, key, label in zip(axes[:3], ("rss_mb", "fds", "threads"),
                              ("RSS (MB)", "open fds", "threads"), strict=True):
        for name in samples[0]["procs"]:
            ax.plot(t, [(s["procs"].get(name) or {}).get(key) for s in samples], label=name)
        ax.set_ylabel(label)
    ax = axes[3]
    for name in samples[0]["nodes"]:
        ax.plot(t, [(s["nodes"].get(name) or {}).get("kv_blocks_used") for s in samples],
                label=f"{name} KV blocks")
    ax.plot(t, [s["router_in_flight"] for s in samples], label="router in flight", linestyle="--")
    ax.set_ylabel("KV blocks / requests")
    ax = axes[4]
    for name in samples[0]["tiers"]:
        ax.plot(t, [s["tiers"][name]["kv_bytes"] / 1e6 for s in samples], label=f"{name} tier")
    ax.axhline(result["kv_offload_bytes"] / 1e6, color="grey", linestyle=":", label="bound")
    ax.set_ylabel("tier on disk (MB)")
    ax = axes[5]
    for name in samples[0]["nodes"]:
        for key, style in (("heap_used_mb", "-"), ("heap_free_mb", ":")):
            ax.plot(t, [(s["nodes"].get(name) or {}).get(key) for s in samples], linestyle=style,
                    label=f"{name} heap {key.split('_')[1]}")
    ax.plot(t, [(s["procs"].get("router") or {}).get("prefix_index_mb") for s in samples],
            linestyle="--", label="router prefix index")
    ax.set_ylabel("MB")
    ax.set_xlabel("minutes")
    for ax in axes:
        for e in result["events"]:
            if e["what"] != "kill":
                ax.axvline(e["t"] / 60, color="orange" if e["what"] == "restart" else "grey",
                           alpha=0.4)
        for k in result["kills"]:
            ax.axvline(k["t"] / 60, color="red", alpha=0.4)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"soak: {result['model']}, {result['minutes']} min; node 1 killed (red), drained (orange); "
        "floods (grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
