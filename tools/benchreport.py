"""`tools/bench report`: docs/BENCHMARKS.md and its plots from the result files.

The result files are what `tools/bench compare|sweep|trace --results DIR` write
(compare.json, sweep.json, trace.json: every round's figures plus the run's date, commit,
machine and load average). The report is a pure function of them and of the hand-written
parts (docs/bench/learned.md, docs/bench/sections/*.md), so the same inputs give the same
Markdown and the same SVG bytes. Plots need matplotlib (pip install matplotlib).
"""
import glob
import json
import os
import statistics

# Display names and colours, one per system, the same in every table and plot.
NAMES = {"dfkv": "dfkv", "memcached": "memcached", "redis": "Redis", "rawtcp": "raw TCP",
         "odirect": "O_DIRECT", "dfkv_cold": "dfkv", "dfkv_wb": "dfkv"}
COLORS = {"dfkv": "#1f77b4", "memcached": "#2ca02c", "redis": "#d62728", "rawtcp": "#7f7f7f",
          "odirect": "#9467bd"}
WARM = ("dfkv", "memcached", "redis", "rawtcp")
KINDS = ("compare", "sweep", "trace")

COMMANDS = {
    "compare": "tools/bench compare --quick --no-cabi --results docs/bench/results",
    "sweep": "tools/bench sweep --quick --results docs/bench/results",
    "trace": "tools/bench trace --trace /work/shared/data/traces/conversation_trace.jsonl --results docs/bench/results",
}


class ReportError(Exception):
    """A result file is missing, unreadable or not what `tools/bench` writes."""


def load(d):
    """Returns {kind: result} for the result files in d; at least one must be there."""
    if not os.path.isdir(d):
        raise ReportError("no results directory %s (run %s)" % (d, COMMANDS["compare"]))
    out = {}
    for kind in KINDS:
        path = os.path.join(d, kind + ".json")
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            raise ReportError("%s: %s" % (path, e))
        if not isinstance(r, dict) or r.get("kind") != kind or not isinstance(r.get("meta"), dict):
            raise ReportError("%s: not a `tools/bench %s --results` file (kind/meta missing)" % (path, kind))
        items = r.get("points" if kind == "trace" else "runs")
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise ReportError("%s: %s must be a list of objects" % (path, "points" if kind == "trace" else "runs"))
        need = ("fraction", "capacity_blocks", "hit_ratio", "lru_ratio", "belady_ratio", "max_ratio") \
            if kind == "trace" else ("system", "op", "size", "round", "kind")
        for i, x in enumerate(items):
            miss = [k for k in need if k not in x]
            if miss:
                raise ReportError("%s: entry %d lacks %s" % (path, i, ", ".join(miss)))
        out[kind] = r
    if not out:
        raise ReportError("%s holds none of %s" % (d, ", ".join(k + ".json" for k in KINDS)))
    return out


def size_label(n):
    for suf, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return "%d %s" % (n // mult, suf)
    return "%d B" % n


def stamp(meta):
    """The provenance line every table and plot carries."""
    la = meta.get("loadavg_start") or []
    le = meta.get("loadavg_end") or []
    load = "load average %s at start" % (la[0] if la else "?")
    if le:
        load += ", %s at end" % le[0]
    return "%s, commit %s, %s, %s" % (meta.get("date", "?"), meta.get("commit", "?"), meta.get("machine", "?"), load)


def command(meta, kind):
    argv = meta.get("argv")
    return " ".join(argv) if isinstance(argv, list) and argv else COMMANDS[kind]


def series(runs, system, op, kind, size=None, field="gb_per_s"):
    """The per-round values (by round index) of one measurement."""
    out = {}
    for r in runs:
        if r["system"] == system and r["op"] == op and r["kind"] == kind and (size is None or r["size"] == size) \
                and isinstance(r.get(field), (int, float)):
            out[r["round"]] = float(r[field])
    return out


def med(xs):
    return statistics.median(xs) if xs else None


def paired_ratio(a, b):
    """The median of per-round ratios a/b (both ran in each round, back to back)."""
    rs = [a[k] / b[k] for k in a if k in b and b[k]]
    return med(rs)


def cell(vals, fmt="%.2f"):
    if not vals:
        return "–"
    v = sorted(vals.values())
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (%s–%s)") % (med(v), fmt % v[0], fmt % v[-1])


def rfmt(x):
    return "–" if x is None else "%.2f×" % x


# --- the summary table -------------------------------------------------------------------

def compare_rows(c):
    """(label, {system: per-round values}, unit, ratios) rows of the 1 MiB comparison."""
    runs, size = c["runs"], c.get("size", 1 << 20)
    conns, cconns = c.get("conns", "?"), c.get("cold_conns", "?")
    rows = []
    for op in ("get", "put"):
        vals = {s: series(runs, s, op, "warm") for s in WARM}
        ratios = [("raw TCP", paired_ratio(vals["dfkv"], vals["rawtcp"])),
                  ("memcached", paired_ratio(vals["dfkv"], vals["memcached"])),
                  ("Redis", paired_ratio(vals["dfkv"], vals["redis"]))]
        what = "warm %s %s, %s conns, GB/s" % (op.upper(), size_label(size), conns)
        if op == "put":
            what += " (dfkv: write-through, durable before the ack)"
        rows.append((what, vals, ratios))
    cg = {"dfkv": series(runs, "dfkv_cold", "get", "cold"), "odirect": series(runs, "odirect", "get", "cold")}
    rows.append(("cold GET %s, %s conns, GB/s (dfkv: slab, no RAM tier)" % (size_label(size), cconns), cg,
                 [("O_DIRECT", paired_ratio(cg["dfkv"], cg["odirect"]))]))
    cp = {"dfkv": series(runs, "dfkv_wb", "put", "cold"), "odirect": series(runs, "odirect", "put", "cold")}
    if cp["dfkv"]:
        rows.append(("sustained PUT %s, %s conns, GB/s (dfkv: write-back; O_DIRECT+O_DSYNC)" % (size_label(size), conns),
                     cp, [("O_DIRECT", paired_ratio(cp["dfkv"], cp["odirect"]))]))
    lat = {s: series(runs, s, "get", "latency", field="p50_us") for s in WARM}
    rows.append(("GET 4 KiB p50 latency, 1 conn, µs (lower is better)", lat,
                 [("raw TCP", paired_ratio(lat["dfkv"], lat["rawtcp"]))]))
    return rows


def span(xs):
    """'a×' or 'a×–b×' over the values (min to max)."""
    if not xs:
        return "–"
    lo, hi = "%.2f×" % min(xs), "%.2f×" % max(xs)
    return lo if lo == hi else "%s–%s" % (lo, hi)


def loaded(meta):
    """A warning when the run's load average exceeded the machine's CPUs, else ''."""
    la = (meta.get("loadavg_start") or [0])[0]
    le = (meta.get("loadavg_end") or [0])[0]
    cpus = 0
    m = meta.get("machine", "")
    for part in m.split(","):
        if part.strip().endswith("CPUs"):
            try:
                cpus = int(part.split()[0])
            except ValueError:
                pass
    if cpus and max(la, le) > cpus:
        return ("**The machine was loaded** (load average %s–%s on %d CPUs, other jobs running): absolute "
                "figures are low and single rounds scatter; read the ratios with the rounds' spread." % (
                    min(la, le), max(la, le), cpus))
    return ""


def summary_table(rep):
    out = []
    c = rep.get("compare")
    if c:
        cols = ("dfkv", "memcached", "redis", "rawtcp", "odirect")
        out.append("| measurement (median of rounds, min–max) | %s | dfkv ÷ |" % " | ".join(NAMES[s] for s in cols))
        out.append("|---|" + "---|" * (len(cols) + 1))
        for what, vals, ratios in compare_rows(c):
            fmt = "%.1f" if "latency" in what else "%.2f"
            cells = [cell(vals.get(s), fmt) if s in vals else "" for s in cols]
            rs = ", ".join("%s %s" % (n, rfmt(x)) for n, x in ratios if x is not None) or "–"
            out.append("| %s | %s | %s |" % (what, " | ".join(cells), rs))
        out.append("")
        out.append("Ratios are medians of per-round ratios (the systems of a round run back to back). "
                   "Run: %s." % stamp(c["meta"]))
        if loaded(c["meta"]):
            out += ["", loaded(c["meta"])]
        checks = c.get("checks") or []
        for kind in ("warm", "cold"):
            ks = [k for k in checks if isinstance(k, dict) and k.get("kind") == kind]
            if ks:
                bad = sum(1 for k in ks if not k.get("ok"))
                out.append("")
                out.append("%s_check (the server's /metrics around each dfkv GET measurement: %s): %s of %d "
                           "measurements." % (kind, "all RAM hits, zero device reads" if kind == "warm"
                                              else "every GET a device read", "PASS, all" if not bad
                                              else "FAIL, %d" % bad, len(ks)))
        fails = c.get("failures") or []
        if fails:
            out.append("")
            out.append("Failed measurements in that run: %s." % "; ".join(fails))
    t = rep.get("trace")
    if t and t["points"]:
        if out:
            out.append("")
        pts = sorted(t["points"], key=lambda p: -p["fraction"])
        out.append("Hit ratio on the %s trace (%s blocks): dfkv live %s of an exact LRU at 1/%d … 1/%d of the "
                   "distinct blocks; Belady's offline optimum %s of LRU." % (
                       t.get("trace", "?"), size_label(t.get("block_bytes", 0)),
                       span([p["hit_ratio"] / p["lru_ratio"] for p in pts if p["lru_ratio"]]),
                       pts[0]["fraction"], pts[-1]["fraction"],
                       span([p["belady_ratio"] / p["lru_ratio"] for p in pts if p["lru_ratio"]])))
    return out


def sweep_table(s):
    runs, sizes = s["runs"], sorted({r["size"] for r in s["runs"]})
    systems = [x for x in WARM if any(r["system"] == x for r in runs)]
    out = ["| value size | %s | dfkv ÷ raw TCP |" % " | ".join(NAMES[x] for x in systems),
           "|---|" + "---|" * (len(systems) + 1)]
    for z in sizes:
        vals = {x: series(runs, x, "get", "warm", z) for x in systems}
        r = paired_ratio(vals.get("dfkv", {}), vals.get("rawtcp", {}))
        out.append("| %s | %s | %s |" % (size_label(z), " | ".join(cell(vals[x], "%.3g") for x in systems), rfmt(r)))
    return out


def trace_table(t):
    out = ["| capacity | blocks | dfkv live | exact LRU | Belady (offline optimum) | infinite | live ÷ LRU | "
           "Belady ÷ LRU |", "|---|---|---|---|---|---|---|---|"]
    for p in sorted(t["points"], key=lambda p: -p["fraction"]):
        lru = p["lru_ratio"]
        out.append("| 1/%d | %d | %.4f | %.4f | %.4f | %.4f | %s | %s |" % (
            p["fraction"], p["capacity_blocks"], p["hit_ratio"], lru, p["belady_ratio"], p["max_ratio"],
            rfmt(p["hit_ratio"] / lru if lru else None), rfmt(p["belady_ratio"] / lru if lru else None)))
    return out


# --- plots ---------------------------------------------------------------------------------

def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the plots need matplotlib: pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # Same inputs, same SVG bytes: fixed element ids, no creation date.
    plt.rcParams.update({"svg.hashsalt": "dfkv-bench-report", "svg.fonttype": "none", "font.size": 9})
    return plt


def _footer(fig, meta, kind):
    fig.text(0.01, 0.01, "%s\n%s" % (stamp(meta), command(meta, kind)), fontsize=6.5, color="#555555",
             va="bottom", ha="left", wrap=True)


def _save(fig, path):
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": "tools/bench report"})


def _bars(ax, groups, title, ylabel):
    """groups: [(group label, [(system key, legend label, per-round values)])]: bars at the
    median, a whisker over the rounds' min–max, each round a dot."""
    width = 0.8 / max(len(g[1]) for g in groups)
    seen = set()
    for gi, (glabel, bars) in enumerate(groups):
        for bi, (key, label, vals) in enumerate(bars):
            x = gi + (bi - (len(bars) - 1) / 2) * width
            v = sorted(vals.values())
            if not v:
                continue
            m = med(v)
            ax.bar(x, m, width * 0.9, color=COLORS[key], label=None if label in seen else label,
                   yerr=[[m - v[0]], [v[-1] - m]], capsize=3, ecolor="#333333")
            ax.plot([x] * len(v), v, "o", color="#222222", markersize=2.5)
            ax.text(x, v[-1], " %.2f" % m, rotation=90, va="bottom", ha="center", fontsize=6.5)
            seen.add(label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g[0] for g in groups])
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.25)
    ax.legend(fontsize=7, loc="upper right")


def plot_compare(plt, c, path):
    runs, size = c["runs"], size_label(c.get("size", 1 << 20))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4.2), gridspec_kw={"width_ratios": [2, 1.3]})
    warm = [(op.upper(), [(s, NAMES[s], series(runs, s, op, "warm")) for s in WARM]) for op in ("get", "put")]
    _bars(a1, warm, "warm %s, %s conns (dfkv: RAM tier; PUT write-through)" % (size, c.get("conns", "?")), "GB/s")
    cold = [("GET", [("dfkv", "dfkv", series(runs, "dfkv_cold", "get", "cold")),
                     ("odirect", "O_DIRECT", series(runs, "odirect", "get", "cold"))])]
    if series(runs, "dfkv_wb", "put", "cold"):
        cold.append(("PUT sustained", [("dfkv", "dfkv", series(runs, "dfkv_wb", "put", "cold")),
                                       ("odirect", "O_DIRECT", series(runs, "odirect", "put", "cold"))]))
    _bars(a2, cold, "cold %s (dfkv: slab; write-back PUT)" % size, "GB/s")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    _footer(fig, c["meta"], "compare")
    _save(fig, path)
    plt.close(fig)


def plot_sweep(plt, s, path):
    runs, sizes = s["runs"], sorted({r["size"] for r in s["runs"]})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for x in WARM:
        pts = [(z, sorted(series(runs, x, "get", "warm", z).values())) for z in sizes]
        pts = [(z, v) for z, v in pts if v]
        if not pts:
            continue
        zs, ms = [z for z, _ in pts], [med(v) for _, v in pts]
        lo, hi = [m - v[0] for (_, v), m in zip(pts, ms)], [v[-1] - m for (_, v), m in zip(pts, ms)]
        ax.errorbar(zs, ms, yerr=[lo, hi], marker="o", markersize=3.5, capsize=2.5, color=COLORS[x], label=NAMES[x])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(z).replace(" ", "") for z in sizes])
    ax.set_xlabel("value size")
    ax.set_ylabel("GET GB/s (median of rounds, whiskers min–max)")
    ax.set_title("warm GET throughput by value size, %s conns" % s.get("conns", "?"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _footer(fig, s["meta"], "sweep")
    _save(fig, path)
    plt.close(fig)


def plot_trace(plt, t, path):
    pts = sorted(t["points"], key=lambda p: -p["fraction"])
    xs = [1 / p["fraction"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for field, label, style, color in (("belady_ratio", "Belady (offline optimum)", "--", "#ff7f0e"),
                                       ("hit_ratio", "dfkv live", "-", COLORS["dfkv"]),
                                       ("lru_ratio", "exact LRU", ":", "#333333")):
        ax.plot(xs, [p[field] for p in pts], style, marker="o", markersize=3.5, color=color, label=label)
    ax.axhline(pts[0]["max_ratio"], color="#999999", linewidth=0.8)
    ax.text(xs[0], pts[0]["max_ratio"], " infinite cache %.3f" % pts[0]["max_ratio"], va="bottom", fontsize=7,
            color="#666666")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels(["1/%d" % p["fraction"] for p in pts])
    ax.set_xlabel("capacity (share of the trace's %s distinct blocks)" % t.get("distinct_blocks", "?"))
    ax.set_ylabel("prefix hit ratio (block references hit)")
    ax.set_title("hit ratio against capacity: %s, %s blocks" % (t.get("trace", "?"), size_label(t.get("block_bytes", 0))))
    ax.set_ylim(0, max(p["max_ratio"] for p in pts) * 1.15)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _footer(fig, t["meta"], "trace")
    _save(fig, path)
    plt.close(fig)


# --- the document --------------------------------------------------------------------------

PLOTS = {"compare": "throughput_1mib.svg", "sweep": "get_by_size.svg", "trace": "hit_ratio.svg"}


def read_part(path):
    with open(path) as f:
        return f.read().strip("\n")


def render(rep, img_dir_rel, learned, sections, results_rel):
    L = ["# dfkv benchmarks", "",
         "<!-- Generated by `tools/bench report` from %s/*.json. Do not edit here: hand-written parts live in "
         "docs/bench/learned.md and docs/bench/sections/*.md. -->" % results_rel, "",
         "dfkv against memcached, Redis, a raw loopback TCP request/reply server (wire speed) and raw O_DIRECT "
         "file I/O (disk speed) on one machine, in one run, through one harness (`build/dfkv_bench`); and the "
         "hit ratio it reaches on a real inference trace against exact LRU and Belady's offline optimum. "
         "Absolute figures on a shared VM move by tens of percent between runs; compare the ratios within "
         "one run, and read the load average printed with each run.", "",
         "## Summary", ""]
    L += summary_table(rep) or ["No result files yet: run the commands under [Reproduce](#reproduce)."]
    L.append("")
    c = rep.get("compare")
    L += ["## 1 MiB GET and PUT, warm and cold", ""]
    if c:
        L += ["![1 MiB throughput, warm and cold](%s/%s)" % (img_dir_rel, PLOTS["compare"]), "",
              "Warm: dfkv serves GETs from its RAM tier (every measured GET checked against the server's "
              "metrics: RAM hits, zero device reads) and acknowledges a PUT once it is durable on the slab; "
              "memcached, Redis and raw TCP keep values in RAM only. Cold: dfkv without the RAM tier reads "
              "every value from the device with O_DIRECT, against O_DIRECT preads of a file on the same file "
              "system; the sustained PUT is dfkv's write-back tier at its flush rate against O_DIRECT|O_DSYNC "
              "writes. Bars: median round; whiskers: min–max; dots: each round.", "",
              "Command: `%s`" % command(c["meta"], "compare"), ""]
    else:
        L += ["No compare.json: run `%s`." % COMMANDS["compare"], ""]
    s = rep.get("sweep")
    L += ["## GET throughput by value size", ""]
    if s:
        L += ["![GET throughput by value size](%s/%s)" % (img_dir_rel, PLOTS["sweep"]), ""]
        L += sweep_table(s)
        L += ["", "GB/s, median of rounds (min–max). Run: %s. %s" % (stamp(s["meta"]), loaded(s["meta"])), "",
              "Command: `%s`" % command(s["meta"], "sweep"), ""]
    else:
        L += ["No sweep.json: run `%s`." % COMMANDS["sweep"], ""]
    t = rep.get("trace")
    L += ["## Hit ratio against capacity", ""]
    if t and t["points"]:
        L += ["![hit ratio against capacity](%s/%s)" % (img_dir_rel, PLOTS["trace"]), ""]
        L += trace_table(t)
        L += ["", "The replay (`dfkv_bench trace`) runs the requests in order against a live dfkv_server "
              "(slab engine, default flags, `--cap` = capacity × block bytes): per request a lookup, a GET "
              "of the hit prefix (every byte checked) and a PUT of the rest. Exact LRU and Belady's offline "
              "optimum (evict the block whose next use is farthest; no online policy can beat it) are "
              "simulated over the same request order at the same capacity. Run: %s%s. The hit ratios do not "
              "depend on the machine's speed (the replay is sequential)." % (
                  stamp(t["meta"]), ("; failed: " + "; ".join(t["failures"])) if t.get("failures") else ""), "",
              "Command: `%s`" % command(t["meta"], "trace"), ""]
    else:
        L += ["No trace.json: run `%s`." % COMMANDS["trace"], ""]
    if learned:
        L += [learned, ""]
    if sections:
        L += ["## Further figures", ""]
        for body in sections:
            L += [body, ""]
    L += ["## Reproduce", "", "```",
          "tools/build.sh",
          COMMANDS["compare"] + "   # ~3 min",
          COMMANDS["sweep"] + "     # ~3 min",
          COMMANDS["trace"] + "   # 2-5 min per capacity",
          "tools/bench report   # this file and docs/bench/*.svg",
          "```", ""]
    return "\n".join(L)


def main(opts):
    rep = load(opts.results)
    out = os.path.abspath(opts.out)
    plots = os.path.abspath(opts.plots or os.path.join(os.path.dirname(out), "bench"))
    os.makedirs(plots, exist_ok=True)
    plt = _plt()
    drawn = []
    for kind, fn in (("compare", plot_compare), ("sweep", plot_sweep), ("trace", plot_trace)):
        r = rep.get(kind)
        if r and (r.get("points") if kind == "trace" else r.get("runs")):
            p = os.path.join(plots, PLOTS[kind])
            fn(plt, r, p)
            drawn.append(p)
    learned = read_part(opts.learned) if opts.learned and os.path.exists(opts.learned) else ""
    sections = []
    if opts.sections and os.path.isdir(opts.sections):
        for p in sorted(glob.glob(os.path.join(opts.sections, "*.md"))):
            if os.path.basename(p).lower() != "readme.md":
                sections.append(read_part(p))
    rel = os.path.relpath(plots, os.path.dirname(out))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res_rel = os.path.relpath(os.path.abspath(opts.results), root)
    if res_rel.startswith(".."):
        res_rel = opts.results
    text = render(rep, rel, learned, sections, res_rel)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    print("report: wrote %s and %s" % (out, ", ".join(drawn) or "no plots"))
    return 0
