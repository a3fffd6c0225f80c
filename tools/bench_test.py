"""tools/bench's clean-up: a run that is killed (SIGTERM, SIGINT, SIGHUP) or fails stops the
servers it started (they run in sessions of their own, so nothing else would) and removes its
temp dir. The run here is the real `tools/bench rounds` code (benchrounds.run) with the real
Procs and stop_on_exit that compare, sweep and trace use too; only what needs built binaries
stands in: the "server" is a script that sleeps, and waiting for its address blocks, as a
long measurement does (or fails, for the error path). Run: python3 -m pytest -q tools/bench_test.py"""
import os
import signal
import subprocess
import sys
import time

import pytest

TOOLS = os.path.dirname(os.path.abspath(__file__))

DRIVER = r'''
import argparse, importlib.machinery, importlib.util, os, sys, time
tools, server, mode = sys.argv[1:4]
loader = importlib.machinery.SourceFileLoader("bench", os.path.join(tools, "bench"))
b = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench", loader))
loader.exec_module(b)
sys.path.insert(0, tools)
import benchrounds

def wait_addr_file(path, proc, name, logpath, timeout=20):
    print("server", proc.pid, flush=True)
    if mode == "fail":
        raise b.SetupError("stand-in: no address")
    time.sleep(300)  # a measurement in progress

b.SERVER = server
b.ensure_baselines = lambda: {"redis": None, "memcached": None}
b.run_meta = lambda: {}
b.wait_addr_file = wait_addr_file
opts = argparse.Namespace(size="1MiB", wb_dirty_bytes="64MiB", rounds=5, duration=1.0, conns=1, cold_conns=1,
                          out=os.path.join(os.environ["TMPDIR"], "out"), no_build=True, base_build="",
                          wb_server_arg=[])
try:
    sys.exit(benchrounds.run(opts, b))
except b.SetupError as e:
    b.log("setup error: %s" % e)
    sys.exit(2)
'''


def start(tmp_path, mode):
    server = tmp_path / "fake_server"
    server.write_text("#!/bin/sh\nexec sleep 300\n")
    server.chmod(0o755)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", DRIVER, TOOLS, str(server), mode], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()  # bounded: the driver prints it once the server runs, or exits
    if not line.startswith("server "):
        p.kill()
        pytest.fail("driver did not start the server: %r %s" % (line, p.communicate(timeout=30)[1]))
    return p, int(line.split()[1])


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_cleaned(tmp_path, pid):
    end = time.time() + 10  # the driver reaped it in stop_all; an orphan would still run
    while alive(pid) and time.time() < end:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("server pid %d outlived the run" % pid)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("dfkv-rounds-")], "temp dir left behind"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_rounds_killed_stops_servers(tmp_path, sig):
    p, pid = start(tmp_path, "hang")
    assert alive(pid)
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the run did not end within 30 s of signal %d" % sig)
    assert p.returncode == 130, err
    assert "interrupted (signal %d): stopping servers" % sig in err
    assert_cleaned(tmp_path, pid)


def test_rounds_failed_setup_stops_servers(tmp_path):
    p, pid = start(tmp_path, "fail")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2, err
    assert "setup error: stand-in: no address" in err
    assert_cleaned(tmp_path, pid)
