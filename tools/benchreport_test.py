"""`tools/bench report` on the checked-in fixture (tools/testdata/bench-results: the result
files of real, short `tools/bench compare|sweep|trace --results` runs): it writes the summary
table, the per-size and per-capacity tables and three SVG plots that carry the run's date,
commit and machine; the same inputs give the same bytes; bad result files fail with one
clear line. Run: python3 -m pytest -q tools/benchreport_test.py (needs matplotlib)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

TOOLS = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(TOOLS, "bench")
FIXTURE = os.path.join(TOOLS, "testdata", "bench-results")
sys.path.insert(0, TOOLS)
import benchreport  # noqa: E402


def report(tmp_path, results=FIXTURE, sections=None, learned=None):
    out = tmp_path / "docs" / "BENCHMARKS.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, BENCH, "report", "--results", str(results), "--out", str(out),
            "--sections", str(sections or tmp_path / "no-sections"), "--learned", str(learned or tmp_path / "none.md")]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r, out


def fixture(kind):
    with open(os.path.join(FIXTURE, kind + ".json")) as f:
        return json.load(f)


def test_report_on_fixture(tmp_path):
    r, out = report(tmp_path)
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    cmp_, trace = fixture("compare"), fixture("trace")
    # The summary table: one row per measurement, every system a column, medians with the
    # rounds' spread, and the dfkv ratios computed from the fixture's rounds.
    assert "| measurement (median of rounds, min–max) | dfkv | memcached | Redis | raw TCP | O_DIRECT | dfkv ÷ |" in md
    for row in ("| warm GET 1 MiB, 4 conns, GB/s |", "| warm PUT 1 MiB, 4 conns, GB/s (dfkv: write-through",
                "| cold GET 1 MiB, 8 conns, GB/s", "| sustained PUT 1 MiB", "| GET 4 KiB p50 latency"):
        assert row in md, row
    d = benchreport.series(cmp_["runs"], "dfkv", "get", "warm")
    m = benchreport.series(cmp_["runs"], "memcached", "get", "warm")
    assert len(d) == 2 and "memcached %.2f×" % statistics.median(d[k] / m[k] for k in d) in md
    # Provenance: every table's run line and every plot carry date, commit and machine.
    meta = cmp_["meta"]
    assert meta["commit"] in md and meta["date"] in md and meta["machine"] in md
    assert "load average %s at start" % meta["loadavg_start"][0] in md
    # The fixture ran at load ~20 on 2 CPUs: the report says so.
    assert "**The machine was loaded** (load average" in md and "on 2 CPUs" in md
    # The metrics checks of the run are reported with their verdict.
    warm = [k for k in cmp_["checks"] if k["kind"] == "warm"]
    assert "warm_check (" in md and "PASS, all of %d measurements." % len(warm) in md
    # The sweep and trace tables.
    assert "| value size | dfkv | memcached | Redis | raw TCP | dfkv ÷ raw TCP |" in md
    assert "| 16 MiB |" in md and "| 4 KiB |" in md
    for p in trace["points"]:
        assert "| 1/%d | %d | %.4f | %.4f | %.4f |" % (p["fraction"], p["capacity_blocks"], p["hit_ratio"],
                                                      p["lru_ratio"], p["belady_ratio"]) in md
    # Each figure with the command that produced it, and the plots it links exist.
    for kind in ("compare", "sweep", "trace"):
        assert "Command: `%s`" % " ".join(fixture(kind)["meta"]["argv"]) in md
    for name in ("throughput_1mib.svg", "get_by_size.svg", "hit_ratio.svg"):
        assert "](bench/%s)" % name in md
        svg = out.parent / "bench" / name
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")
        text = svg.read_text()
        kind = {"throughput_1mib.svg": "compare", "get_by_size.svg": "sweep", "hit_ratio.svg": "trace"}[name]
        assert fixture(kind)["meta"]["commit"] in text and fixture(kind)["meta"]["date"] in text, name
    assert "## Reproduce" in md and "tools/bench report" in md


def test_report_is_deterministic(tmp_path):
    r1, out1 = report(tmp_path / "a")
    r2, out2 = report(tmp_path / "b")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert out1.read_text() == out2.read_text()
    for name in ("throughput_1mib.svg", "get_by_size.svg", "hit_ratio.svg"):
        assert (out1.parent / "bench" / name).read_bytes() == (out2.parent / "bench" / name).read_bytes(), name


def test_sections_and_learned_included_verbatim(tmp_path):
    sec = tmp_path / "sections"
    sec.mkdir()
    (sec / "README.md").write_text("not included\n")
    (sec / "b-branch.md").write_text("### Figure B\n\nbody b, `cmd b`\n")
    (sec / "a-branch.md").write_text("### Figure A\n\nbody a\n")
    learned = tmp_path / "learned.md"
    learned.write_text("## What we learned\n\n- a lesson (`some command`)\n")
    r, out = report(tmp_path, sections=sec, learned=learned)
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    assert "## What we learned\n\n- a lesson (`some command`)\n" in md
    assert "### Figure A\n\nbody a\n" in md and "### Figure B\n\nbody b, `cmd b`\n" in md
    assert md.index("### Figure A") < md.index("### Figure B")
    assert "not included" not in md


def test_partial_results(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    shutil.copy(os.path.join(FIXTURE, "trace.json"), d)
    r, out = report(tmp_path, results=d)
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    assert "No compare.json: run `tools/bench compare" in md and "No sweep.json" in md
    assert (out.parent / "bench" / "hit_ratio.svg").exists()
    assert not (out.parent / "bench" / "throughput_1mib.svg").exists()


@pytest.mark.parametrize("name,content,msg", [
    ("compare.json", "{not json", "compare.json: "),
    ("compare.json", '{"kind": "sweep", "meta": {}, "runs": []}', "not a `tools/bench compare --results` file"),
    ("trace.json", '{"kind": "trace", "meta": {}, "points": [{"fraction": 4}]}', "entry 0 lacks capacity_blocks"),
    ("sweep.json", '{"kind": "sweep", "meta": {}, "runs": {}}', "runs must be a list"),
])
def test_bad_result_files(tmp_path, name, content, msg):
    d = tmp_path / "res"
    d.mkdir()
    (d / name).write_text(content)
    r, out = report(tmp_path, results=d)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert not out.exists()


def test_missing_results(tmp_path):
    r, _ = report(tmp_path, results=tmp_path / "nowhere")
    assert r.returncode == 2 and "no results directory" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    r, _ = report(tmp_path, results=tmp_path / "empty")
    assert r.returncode == 2 and "holds none of compare.json" in r.stderr, r.stderr


def test_paired_ratio():
    assert benchreport.paired_ratio({0: 2.0, 1: 3.0, 2: 9.0}, {0: 1.0, 1: 1.0, 2: 3.0}) == 3.0
    assert benchreport.paired_ratio({0: 2.0}, {1: 1.0}) is None
    assert benchreport.paired_ratio({0: 2.0}, {0: 0.0}) is None


def test_trace_mode_feeds_the_report(tmp_path):
    """`tools/bench trace --results` with the real binaries (tools/test.sh builds them first)
    on a slice of the shipped trace, then `tools/bench report` on what it wrote."""
    root = os.path.dirname(TOOLS)
    build = os.environ.get("DFKV_BUILD_DIR", os.path.join(root, "build"))
    for b in ("dfkv_server", "dfkv_bench"):
        assert os.access(os.path.join(build, b), os.X_OK), "run tools/build.sh first: %s/%s missing" % (build, b)
    res = tmp_path / "res"
    r = subprocess.run([sys.executable, BENCH, "trace", "--limit", "300", "--fractions", "8,4", "--block-bytes",
                        "16KiB", "--no-build", "--max-time", "120", "--results", str(res)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    t = json.loads((res / "trace.json").read_text())
    assert [p["fraction"] for p in t["points"]] == [8, 4] and t["meta"]["commit"] and t["meta"]["loadavg_end"]
    for p in t["points"]:
        assert p["errors"] == 0 and p["corrupt"] == 0
        assert p["capacity_blocks"] <= t["distinct_blocks"] // p["fraction"]
        assert 0 < p["lru_ratio"] <= p["belady_ratio"] <= p["max_ratio"]
    rr, out = report(tmp_path, results=res)
    assert rr.returncode == 0, rr.stderr
    assert "| 1/4 | %d |" % t["points"][1]["capacity_blocks"] in out.read_text()
