"""pytest plugin: the run fails on any skip (or xfail) that an allow-list does not name.

A skipped test checks nothing, so a suite that skips by accident goes green by accident.
tools/test.sh loads this plugin (``-p pytest_skipguard`` with tools/ on PYTHONPATH) with
``--skip-allowlist python/tests/skip-allowlist.txt``. Every skip is printed; one that no entry
allows turns the exit status to 1.

Allow-list format, one entry a line, each preceded by at least one ``#`` comment line that
says why the skip is acceptable (an entry without a reason is an error)::

    # why this skip is fine
    [ENV=value] tests/path/test_file.py: reason prefix

The optional ``[ENV=value]`` makes the entry apply only while that environment variable has
that value. The path is the test's file relative to pytest's rootdir; the reason matches the
start of the skip reason.
"""

from __future__ import annotations

import os
import re

import pytest

_ENTRY = re.compile(r"^(?:\[(?P<env>[A-Za-z_][A-Za-z0-9_]*)=(?P<val>[^\]]*)\]\s+)?(?P<path>[^:\s]+):\s*(?P<reason>.+)$")


class AllowListError(Exception):
    pass


def parse_allowlist(text: str, where: str = "allow-list"):
    """Returns [(env, value, path, reason_prefix)]; raises AllowListError on a bad line."""
    entries, reasoned = [], False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            reasoned = False
            continue
        if line.startswith("#"):
            reasoned = reasoned or len(line.lstrip("#").strip()) > 0
            continue
        m = _ENTRY.match(line)
        if not m:
            raise AllowListError(f"{where}:{n}: cannot parse {raw!r} (want '[ENV=value] path: reason')")
        if not reasoned:
            raise AllowListError(f"{where}:{n}: entry {raw!r} has no '# reason' comment above it")
        entries.append((m["env"], m["val"], m["path"], m["reason"].strip()))
        reasoned = False
    return entries


def pytest_addoption(parser):
    parser.addoption("--skip-allowlist", default=None,
                     help="fail the run on any skip or xfail this file does not allow (tools/pytest_skipguard.py)")


def pytest_configure(config):
    path = config.getoption("--skip-allowlist")
    if path is None:
        return
    with open(path, encoding="utf-8") as f:
        entries = parse_allowlist(f.read(), path)
    config.pluginmanager.register(_Guard(entries), "dfkv-skipguard")


def _reason(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfail: " + (report.wasxfail or "")
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        r = str(lr[2])
    else:
        r = str(lr)
    return r[len("Skipped: "):] if r.startswith("Skipped: ") else r


class _Guard:
    def __init__(self, entries):
        self.entries = entries
        self.skips = []  # (nodeid, file, reason)

    def _note(self, report):
        if report.skipped or hasattr(report, "wasxfail"):
            file = report.nodeid.split("::", 1)[0]
            self.skips.append((report.nodeid, file, _reason(report)))

    def pytest_collectreport(self, report):
        self._note(report)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.skipped:
            self._note(report)

    def _allowed(self, file, reason):
        for env, val, path, prefix in self.entries:
            if env is not None and os.environ.get(env) != val:
                continue
            if path == file and reason.startswith(prefix):
                return True
        return False

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.bad = [s for s in self.skips if not self._allowed(s[1], s[2])]
        if self.bad and session.exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        tr.section("skip guard (tools/pytest_skipguard.py)")
        if not self.skips:
            tr.write_line("no skips")
        for nodeid, _, reason in self.skips:
            ok = "allowed" if (nodeid, _, reason) not in getattr(self, "bad", []) else "NOT ALLOWED"
            tr.write_line(f"{ok}: {nodeid}: {reason}")
        if getattr(self, "bad", None):
            tr.write_line(f"{len(self.bad)} skip(s) not in the allow-list: the run fails", red=True)
