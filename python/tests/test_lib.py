"""Locating and lazily loading libdfkv.so. Import-time laziness and the search order run
without the library; loading itself needs build/libdfkv.so (or $DFKV_LIB)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import LIB_PATH, PYTHON_DIR, REPO, run_python

from dfkv import _lib

needs_lib = pytest.mark.skipif(not LIB_PATH.is_file(), reason=f"not built: {LIB_PATH} (run tools/build.sh)")


def test_import_does_not_load_library():
    # A fresh interpreter: importing every public module must not map libdfkv.so, because a
    # parent that imports dfkv and then forks must not carry a Go runtime into its children.
    r = run_python(
        "import dfkv, dfkv.client, dfkv.identity, dfkv.ring, dfkv._lib as L\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libdfkv' not in maps, 'libdfkv mapped at import'\n"
        "assert not L.is_loaded()\n"
        "dfkv.identity.object_id(b'n', b'k'); dfkv.ring.Ring(['a'])\n"
        "assert 'libdfkv' not in open('/proc/self/maps').read()\n"
        "print('ok')\n",
        env={"DFKV_LIB": str(LIB_PATH)},
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_search_order(monkeypatch):
    monkeypatch.delenv("DFKV_LIB", raising=False)
    c = _lib.candidates()
    assert c[0] == str(PYTHON_DIR / "dfkv" / "lib" / "libdfkv.so")  # installed wheel layout
    assert str(REPO / "build" / "libdfkv.so") in c[1:]                  # build tree
    assert c.index(str(PYTHON_DIR / "build" / "libdfkv.so")) < c.index(str(REPO / "build" / "libdfkv.so"))
    monkeypatch.setenv("DFKV_LIB", "/opt/x/libdfkv.so")
    assert _lib.candidates() == ["/opt/x/libdfkv.so"]  # explicit path stands alone


def test_missing_library_error_lists_what_was_tried(tmp_path):
    bogus = tmp_path / "nope" / "libdfkv.so"
    notlib = tmp_path / "libdfkv.so"
    notlib.write_text("not an ELF file")
    for path, why in ((bogus, "not found"), (notlib, "")):
        r = run_python(
            "import dfkv\n"
            "try:\n"
            "    dfkv.Client('n1=127.0.0.1:1')\n"
            "except dfkv.DfkvError as e:\n"
            "    print('ERR', e)\n",
            env={"DFKV_LIB": str(path)},
        )
        assert r.returncode == 0, r.stderr
        assert "ERR cannot load libdfkv.so" in r.stdout and str(path) in r.stdout and why in r.stdout


@needs_lib
def test_load_maps_library_once_and_declares_everything():
    r = run_python(
        "import dfkv, dfkv._lib as L\n"
        "v = dfkv.version()\n"
        "assert isinstance(v, str) and v, v\n"
        "lib = L.load(); assert lib is L.load()\n"
        "for name, (res, args) in L._abi.PROTOTYPES.items():\n"
        "    f = getattr(lib, name); assert f.restype is res and list(f.argtypes) == args, name\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert L.loaded_path() and L.loaded_path() in maps\n"
        "print('version', v)\n",
        env={"DFKV_LIB": str(LIB_PATH)},
    )
    assert r.returncode == 0, r.stdout + r.stderr


@needs_lib
def test_build_tree_fallback_without_env():
    if LIB_PATH != REPO / "build" / "libdfkv.so":
        pytest.skip("DFKV_LIB points outside the build tree")
    env = {k: v for k, v in os.environ.items() if k != "DFKV_LIB"}
    r = run_python("import dfkv, dfkv._lib as L\ndfkv.version()\nprint(L.loaded_path())",
                   env={**env, "DFKV_LIB": ""})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == REPO / "build" / "libdfkv.so"
