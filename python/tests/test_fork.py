"""Fork safety with the real library and server: import in a parent, fork, use in the child.

Each scenario runs in a fresh interpreter, so the pytest process (which has the library loaded
for other tests) never forks a Go runtime itself.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_python

pytestmark = pytest.mark.server


def _run(code: str, members: str):
    r = run_python(textwrap.dedent(code), env={"DFKV_MEMBERS": members}, timeout=120)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def test_fork_then_use(members):
    out = _run("""
        import os, sys, traceback
        import dfkv, dfkv._lib as L
        members = os.environ["DFKV_MEMBERS"]
        assert not L.is_loaded() and "libdfkv" not in open("/proc/self/maps").read()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with dfkv.Client(members, namespace=b"fork\\x00test") as c:
                    v = os.urandom(10000)
                    ok = c.put(b"child-key", v) and c.get(b"child-key", len(v)) == v
                    ok = ok and c.put(b"from-child", b"hello parent")
                code = 0 if ok else 3
            except BaseException:
                traceback.print_exc()
                code = 2
            os._exit(code)  # skip atexit/finalizers: this is a forked child
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert not L.is_loaded(), "the parent must still be library-free"
        with dfkv.Client(members, namespace=b"fork\\x00test") as c:
            assert c.get_auto(b"from-child", 64) == b"hello parent"
        print("ok")
    """, members)
    assert "ok" in out


def test_multiprocessing_fork_pool(members):
    out = _run("""
        import os, multiprocessing as mp
        import dfkv
        members = os.environ["DFKV_MEMBERS"]

        def work(i):
            with dfkv.Client(members, namespace=b"mp") as c:
                v = bytes([i]) * (1000 + i)
                return c.put(b"w%d" % i, v) and c.get(b"w%d" % i, len(v)) == v

        if __name__ == "__main__":
            with mp.get_context("fork").Pool(3) as pool:
                res = pool.map(work, range(6))
            assert res == [True] * 6, res
            print("ok")
    """, members)
    assert "ok" in out


def test_inherited_client_refuses_in_child(members):
    out = _run("""
        import os, traceback
        import dfkv
        members = os.environ["DFKV_MEMBERS"]
        c = dfkv.Client(members, namespace=b"inherit")
        assert c.put(b"k", b"parent")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                c.get(b"k", 6)
                code = 4          # used the parent's Go runtime: must not happen
            except dfkv.DfkvError as e:
                if "fork" not in str(e):
                    code = 5
            try:
                dfkv.Client(members)
                code = 6          # loaded library inherited from the parent: must refuse
            except dfkv.DfkvError as e:
                if "fork" not in str(e):
                    code = 7
            except BaseException:
                traceback.print_exc()
                code = 8
            c.close()             # drops the inherited handle without calling into Go
            if not c.closed:
                code = 9
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
        assert c.get(b"k", 6) == b"parent"   # the parent is unaffected
        c.close()
        print("ok")
    """, members)
    assert "ok" in out
