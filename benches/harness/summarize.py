#!/usr/bin/env python3
"""Per-phase figures, ratios to the clean phase and plots from one benches/harness/run.py output
directory: <cell>.raw.csv (the harness's samples), db_poll.csv (run.py's poller), meta.json.

    python3 summarize.py benches/harness/results/<stamp>      # writes summary.md, summary.json, *.png

Figures, per system and phase (the warmup is left out):
- claim p99: the adapter's claim_p99_ms (pickup latency, a rolling 30 s window), the median of
  the phase's samples after its first 30 s (so that every window lies inside the phase), and
  the median of its last 60 s (a held snapshot's cost grows with its age: the end is the worst);
- throughput: the mean completion_rate; offered: the mean enqueue_rate;
- DB active time: pg_stat_database.active_time of the system's database over the phase, per
  second of wall time (ms/s: 1000 is one backend busy all the time);
- claim statement: pg_stat_statements' mean time of the statement that takes jobs;
- back to clean: seconds from the end of the stress phase until the first sample from which
  three in a row (15 s) have claim p99 <= 1.5x and throughput >= 0.8x the clean phase's
  (the 30 s window makes 30 s the floor for a stress that raised the p99).
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

CELL_ORDER = ["idle", "readers", "high-load", "backend-kill", "restart"]
DBS = {"pg_intent": "pg_intent_bench", "pgboss": "pgboss_bench"}
NAMES = {"pg_intent": "pg_intent", "pgboss": "pg-boss"}
COLORS = {"pg_intent": "#1f77b4", "pgboss": "#d62728"}
TINTS = {"warmup": "#D0D0D0", "clean": "#B8B8B8", "idle-in-tx": "#D46A6A", "recovery": "#DCDCDC",
         "active-readers": "#E0B66C", "high-load": "#A378C8", "pg-backend-kill": "#D86A3A",
         "postgres-restart": "#A03030"}


def ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def med(xs):
    return statistics.median(xs) if xs else None


def load_cell(path: Path):
    """{system: {"phases": [(label, type, start, end)], "series": {metric: [(t, v, phase)]}}}"""
    out: dict = {}
    with open(path) as fh:
        for r in csv.DictReader(fh):
            if r["subject_kind"] != "adapter" or r["subject"]:
                continue
            sysd = out.setdefault(r["system"], {"phases": {}, "series": defaultdict(list)})
            t = ts(r["sampled_at"])
            try:
                v = float(r["value"])
            except ValueError:
                continue
            sysd["series"][r["metric"]].append((t, v, r["phase_label"]))
            ph = sysd["phases"].setdefault(r["phase_label"], [r["phase_type"], t, t])
            ph[1] = min(ph[1], t)
            ph[2] = max(ph[2], t)
    for sysd in out.values():
        # Samples every 5 s: a phase began up to 5 s before its first sample.
        sysd["phases"] = [(k, v[0], v[1] - 5.0, v[2]) for k, v in sorted(sysd["phases"].items(), key=lambda kv: kv[1][1])]
    return out


def load_poll(path: Path):
    rows = defaultdict(list)  # (cell, db) -> [(t, active_ms, claim_calls, claim_ms, load1)]
    if not path.exists():
        return rows
    with open(path) as fh:
        for r in csv.DictReader(fh):
            rows[(r["cell"], r["datname"])].append((float(r["t"]), float(r["active_time_ms"]),
                                                  float(r["claim_calls"]), float(r["claim_total_ms"]),
                                                  float(r["load1"]), float(r.get("blks") or "nan"),
                                                  float(r.get("claim_blks") or "nan")))
    return rows


def poll_rates(rows, start, end):
    """Active ms per s, claim statement mean ms, mean load over [start, end] (sums of positive
    deltas: a database recreated or a restarted server resets nothing we count twice)."""
    sel = [r for r in rows if start <= r[0] <= end]
    if len(sel) < 2:
        return None, None, None
    act = calls = cms = 0.0
    for a, b in zip(sel, sel[1:]):
        if b[1] >= a[1]:
            act += b[1] - a[1]
        if b[2] >= a[2] and b[3] >= a[3]:
            calls += b[2] - a[2]
            cms += b[3] - a[3]
    span = sel[-1][0] - sel[0][0]
    return act / span, (cms / calls if calls else None), statistics.mean(r[4] for r in sel)


def poll_buffers(rows, start, end):
    """Shared buffers (hit + read) per second in the database, and per claim statement: the
    work done, whatever the CPU the machine had left to do it with (active time counts a
    backend waiting for a CPU as active)."""
    sel = [r for r in rows if start <= r[0] <= end and len(r) > 6 and r[5] == r[5]]
    if len(sel) < 2:
        return None, None
    blks = cblks = calls = 0.0
    for a, b in zip(sel, sel[1:]):
        if b[5] >= a[5]:
            blks += b[5] - a[5]
        if b[6] >= a[6] and b[2] >= a[2]:
            cblks += b[6] - a[6]
            calls += b[2] - a[2]
    return blks / (sel[-1][0] - sel[0][0]), (cblks / calls if calls else None)


def phase_figures(sysd, poll_rows):
    s = sysd["series"]
    figs = {}
    for label, ptype, start, end in sysd["phases"]:
        if ptype == "warmup":
            continue
        p99 = [v for t, v, ph in s["claim_p99_ms"] if ph == label and t >= start + 30 and v > 0]
        p99_all = [v for t, v, ph in s["claim_p99_ms"] if ph == label and v > 0]
        last = [v for t, v, ph in s["claim_p99_ms"] if ph == label and t >= end - 60 and v > 0]
        done = [v for t, v, ph in s["completion_rate"] if ph == label]
        enq = [v for t, v, ph in s["enqueue_rate"] if ph == label]
        depth = [v for t, v, ph in s["queue_depth"] if ph == label]
        act, claim_ms, load = poll_rates(poll_rows, start, end)
        act60, claim60, _ = poll_rates(poll_rows, end - 60, end)
        bufs, claim_bufs = poll_buffers(poll_rows, start, end)
        bufs60, claim_bufs60 = poll_buffers(poll_rows, end - 60, end)
        figs[label] = {
            "type": ptype, "seconds": round(end - start),
            "claim_p99_ms": med(p99) if p99 else med(p99_all),
            "claim_p99_last60_ms": med(last), "claim_p99_max_ms": max(p99_all) if p99_all else None,
            "claim_p50_ms": med([v for t, v, ph in s["claim_p50_ms"] if ph == label and v > 0]),
            "completion_rate": statistics.mean(done) if done else None,
            "enqueue_rate": statistics.mean(enq) if enq else None,
            "queue_depth_max": max(depth) if depth else None,
            "db_active_ms_per_s": act, "claim_stmt_mean_ms": claim_ms, "load1": load,
            "db_active_last60_ms_per_s": act60, "claim_stmt_last60_ms": claim60,
            "db_buffers_per_s": bufs, "db_buffers_last60_per_s": bufs60,
            "claim_stmt_buffers": claim_bufs, "claim_stmt_last60_buffers": claim_bufs60,
        }
    return figs


def back_to_clean(sysd, clean, stress_label):
    s = sysd["series"]
    phases = sysd["phases"]
    labels = [p[0] for p in phases]
    if stress_label not in labels or clean.get("claim_p99_ms") is None:
        return None
    i = labels.index(stress_label)
    stress_end = phases[i][3]
    p99 = {round(t): v for t, v, ph in s["claim_p99_ms"] if t > stress_end}
    rate = {round(t): v for t, v, ph in s["completion_rate"] if t > stress_end}
    times = sorted(set(p99) & set(rate))
    ok = [p99[t] <= 1.5 * clean["claim_p99_ms"] and rate[t] >= 0.8 * clean["completion_rate"] for t in times]
    for k in range(len(times) - 2):
        if ok[k] and ok[k + 1] and ok[k + 2]:
            return round(times[k] - stress_end)
    return f"not within {round(times[-1] - stress_end) if times else 0} s"


def ratio(a, b):
    return round(a / b, 2) if a is not None and b not in (None, 0) else None


def fmt(x, nd=1):
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    return f"{x:,.{nd}f}"


def plot_cell(cell, data, poll, out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    first = None
    for system, sysd in data.items():
        t0 = sysd["phases"][0][2]
        if first is None:
            first = sysd
            for label, ptype, start, end in sysd["phases"]:
                for ax in axes:
                    ax.axvspan(start - t0, end - t0, color=TINTS.get(ptype, "#EEE"), alpha=0.35, lw=0)
                axes[0].text((start - t0) + 2, 1.0, label, fontsize=7, transform=axes[0].get_xaxis_transform(),
                             va="bottom")
        c = COLORS.get(system, None)
        for ax, metric in ((axes[0], "claim_p99_ms"), (axes[1], "completion_rate")):
            pts = [(t - t0, v) for t, v, _ in sysd["series"][metric]]
            if pts:
                ax.plot(*zip(*pts), color=c, lw=1.2, label=NAMES.get(system, system))
        rows = poll.get((cell, DBS.get(system, "")), [])
        rows = [r for r in rows if sysd["phases"][0][2] <= r[0] <= sysd["phases"][-1][3]]
        pts = [((b[0] + a[0]) / 2 - t0, (b[1] - a[1]) / (b[0] - a[0])) for a, b in zip(rows, rows[1:])
               if b[1] >= a[1] and b[0] > a[0]]
        if pts:
            axes[2].plot(*zip(*pts), color=c, lw=1.2)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("claim p99 ms\n(30 s window, log)")
    axes[1].set_ylabel("completed jobs/s")
    axes[2].set_ylabel("DB active time\nms per s")
    axes[2].set_xlabel("seconds since the system's start in the cell")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"cell {cell}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=72)
    plt.close(fig)


def main():
    d = Path(sys.argv[1])
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {}
    poll = load_poll(d / "db_poll.csv")
    summary = {}
    md = [f"# Harness run {meta.get('started', '')}", "",
          f"PostgreSQL {meta.get('server_version', '?')}, {meta.get('nproc', '?')} CPUs, load average at start "
          f"{', '.join(f'{x:.2f}' for x in meta.get('loadavg_at_start', []))}; pg_intent commit "
          f"`{meta.get('pg_intent_commit', '?')[:10]}`, pg_intent.so sha256 `{(meta.get('pg_intent_so_sha256') or '?')[:12]}`; "
          f"upstream `{meta.get('upstream_commit', '?')[:10]}`. Arguments: `{json.dumps(meta.get('args', {}))}`"
          f"{'; environment: `' + json.dumps(meta['env']) + '`' if meta.get('env') else ''}.", ""]
    for cell in CELL_ORDER:
        raw = d / f"{cell}.raw.csv"
        if not raw.exists():
            continue
        data = load_cell(raw)
        info = meta.get("cells", {}).get(cell, {})
        md += [f"## {cell}", "", f"`{info.get('command', '')}` — exit {info.get('rc', '?')}, {info.get('seconds', '?')} s", ""]
        md += ["| system | phase | s | claim p99 ms (median / last 60 s / max) | p50 ms | completed/s | offered/s | max depth | DB active ms/s (phase / last 60 s) | claim stmt ms (phase / last 60 s) | load | p99 ÷ clean (phase / last 60 s) | tput ÷ clean | active ÷ clean (phase / last 60 s) |",
               "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        cell_sum = {}
        bufrows: list[str] = []
        for system, sysd in data.items():
            figs = phase_figures(sysd, poll.get((cell, DBS.get(system, "")), []))
            clean = next((f for f in figs.values() if f["type"] == "clean"), {})
            stress = next((lab for lab, f in figs.items() if f["type"] not in ("clean", "recovery")), None)
            for lab, f in figs.items():
                f["p99_ratio"] = ratio(f["claim_p99_ms"], clean.get("claim_p99_ms"))
                f["p99_last60_ratio"] = ratio(f["claim_p99_last60_ms"], clean.get("claim_p99_ms"))
                f["throughput_ratio"] = ratio(f["completion_rate"], clean.get("completion_rate"))
                f["active_ratio"] = ratio(f["db_active_ms_per_s"], clean.get("db_active_ms_per_s"))
                f["active_last60_ratio"] = ratio(f["db_active_last60_ms_per_s"], clean.get("db_active_ms_per_s"))
                md.append(f"| {NAMES.get(system, system)} | {lab} ({f['type']}) | {f['seconds']} | "
                          f"{fmt(f['claim_p99_ms'])} / {fmt(f['claim_p99_last60_ms'])} / {fmt(f['claim_p99_max_ms'])} | "
                          f"{fmt(f['claim_p50_ms'])} | {fmt(f['completion_rate'])} | {fmt(f['enqueue_rate'])} | "
                          f"{fmt(f['queue_depth_max'], 0)} | {fmt(f['db_active_ms_per_s'], 0)} / {fmt(f['db_active_last60_ms_per_s'], 0)} | "
                          f"{fmt(f['claim_stmt_mean_ms'], 2)} / {fmt(f['claim_stmt_last60_ms'], 2)} | "
                          f"{fmt(f['load1'], 2)} | {fmt(f['p99_ratio'], 2)} / {fmt(f['p99_last60_ratio'], 2)} | "
                          f"{fmt(f['throughput_ratio'], 2)} | {fmt(f['active_ratio'], 2)} / {fmt(f['active_last60_ratio'], 2)} |")
                if f.get("db_buffers_per_s") is not None:
                    bufrows.append(f"| {NAMES.get(system, system)} | {lab} | {fmt(f['db_buffers_per_s'], 0)} / "
                                   f"{fmt(f['db_buffers_last60_per_s'], 0)} | {fmt(f['claim_stmt_buffers'], 0)} / "
                                   f"{fmt(f['claim_stmt_last60_buffers'], 0)} | "
                                   f"{fmt(ratio(f['db_buffers_last60_per_s'], clean.get('db_buffers_per_s')), 2)} |")
            back = back_to_clean(sysd, clean, stress) if stress else None
            enq = sum(v * 5 for _, v, _ in sysd["series"]["enqueue_rate"])
            done = sum(v * 5 for _, v, _ in sysd["series"]["completion_rate"])
            depth_end = sysd["series"]["queue_depth"][-1][1] if sysd["series"]["queue_depth"] else None
            cell_sum[system] = {"phases": figs, "stress_phase": stress, "back_to_clean_s": back,
                                "enqueued_approx": round(enq), "completed_approx": round(done),
                                "queue_depth_at_end": depth_end}
        md.append("")
        if bufrows:
            md += ["| system | phase | DB buffers/s (phase / last 60 s) | buffers per claim statement (phase / last 60 s) | last-60 s buffers/s ÷ clean |",
                   "|---|---|--:|--:|--:|", *bufrows, ""]
        for system, c in cell_sum.items():
            md.append(f"- {NAMES.get(system, system)}: back to clean after `{c['stress_phase']}`: "
                      f"**{c['back_to_clean_s'] if isinstance(c['back_to_clean_s'], str) else str(c['back_to_clean_s']) + ' s'}**; "
                      f"over the cell ≈{c['enqueued_approx']:,} jobs enqueued, ≈{c['completed_approx']:,} completed, "
                      f"queue depth at the end {fmt(c['queue_depth_at_end'], 0)}.")
        for db, lines in (info.get("top_statements") or {}).items():
            md += ["", f"<details><summary>pg_stat_statements, {db}, top by total time over the cell</summary>", "",
                   "```", *lines, "```", "</details>"]
        md.append("")
        png = d / f"{cell}.png"
        try:
            plot_cell(cell, data, poll, png)
            md += [f"![{cell}]({png.name})", ""]
        except Exception as exc:  # noqa: BLE001
            md += [f"(plot failed: {exc})", ""]
        summary[cell] = cell_sum
    (d / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (d / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
