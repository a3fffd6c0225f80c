"""``remote_url: dfkv://host:port`` alone, through LMCache's own construction path.

The dfkv tree is built the way the wheel is (``setup.py build_py``: the package, the
``_dfkv_lmcache_hook`` module and the ``dfkv-lmcache.pth`` file at the root) into a temporary
directory that each engine process adds as a site directory (``site.addsitedir``), so Python
runs the ``.pth`` exactly as it does from site-packages; the source tree is not on the path.
Then LMCache 0.5.6's ``StorageManager`` is built from an ``LMCacheEngineConfig`` whose only
remote setting is ``remote_url`` (no ``remote_storage_plugins``, no dfkv keys in
``extra_config``): LMCache's ``CreateStorageBackends`` makes its one ``RemoteBackend``, whose
``ConnectorManager`` finds ``DfkvConnectorAdapter`` by its built-in adapter scan. One process
stores a chunk through ``StorageManager.batched_put``; a second one, with an empty local CPU
cache, reads it back through ``StorageManager.get`` from the real dfkv_server, byte-exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("lmcache.v1.storage_backend.storage_manager",
                    reason="lmcache is not installed (tools/test.sh installs lmcache==0.5.6 --no-deps)")

pytestmark = pytest.mark.server

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENGINE = r'''
import json, site, sys, time
site.addsitedir(SITE)
assert "_dfkv_lmcache_hook" in sys.modules, "the .pth did not run"
import torch
import dfkv
assert dfkv.__file__.startswith(SITE), dfkv.__file__
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.event_manager import EventManager
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.storage_manager import StorageManager

config = LMCacheEngineConfig.from_defaults(chunk_size=16, local_cpu=True, max_local_cpu_size=0.05,
                                           remote_url=URL, save_unfull_chunk=True)
assert not config.remote_storage_plugins
meta = LMCacheMetadata(model_name="dfkv-test/tiny-model", world_size=1, local_world_size=1,
                       worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                       kv_shape=(2, 2, 16, 2, 8), chunk_size=16)
sm = StorageManager(config, meta, EventManager())
try:
    backends = list(sm.storage_backends)
    rb = sm.storage_backends["RemoteBackend"]
    inner = getattr(rb.connection, "_connector", rb.connection)
    key = CacheEngineKey(model_name="dfkv-test/tiny-model", world_size=1, worker_id=0,
                         chunk_hash=CHUNK, dtype=torch.bfloat16)
    out = {"backends": backends, "connector": type(inner).__module__ + "." + type(inner).__name__,
           "members": inner.cfg.members}
    if ROLE == "put":
        obj = sm.allocate(inner.meta_shapes, inner.meta_dtypes, inner.meta_fmt)
        g = torch.Generator().manual_seed(CHUNK)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=g).to(obj.tensor.dtype))
        out["bytes"] = bytes(obj.byte_array).hex()
        sm.batched_put([key], [obj])
        # the remote put runs on LMCache's event loop: wait (bounded) until the object is there
        deadline = time.monotonic() + 30
        while not rb.contains(key) and time.monotonic() < deadline:
            time.sleep(0.01)
        out["stored"] = rb.contains(key)
        with dfkv.Client(inner.cfg.members, namespace=inner._client.namespace) as c:
            out["object"] = (c.get_auto(inner.object_key(key), cap=1 << 20) or b"").hex()
    else:
        out["local_before"] = sm.storage_backends["LocalCPUBackend"].contains(key)
        out["remote_has"] = rb.contains(key)
        got = sm.get(key)
        out["bytes"] = bytes(got.byte_array).hex() if got is not None else None
finally:
    sm.close()
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def wheel_tree(tmp_path_factory):
    """The files the wheel installs, built by the project's setup.py (build_py)."""
    d = tmp_path_factory.mktemp("dfkv-site")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(d)],
                       cwd=PYTHON_DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    for f in ("dfkv-lmcache.pth", "_dfkv_lmcache_hook.py", "dfkv/connectors/_lmcache_discovery/dfkv_adapter.py",
              "dfkv/connectors/lmcache_remote.py"):
        assert (d / f).is_file(), f
    return str(d)


def _engine(site_dir: str, role: str, url: str, chunk: int) -> dict:
    code = f"SITE = {site_dir!r}\nURL = {url!r}\nROLE = {role!r}\nCHUNK = {chunk}\n" + ENGINE
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # dfkv only from the tree
    env.setdefault("DFKV_LIB", os.path.join(os.path.dirname(PYTHON_DIR), "build", "libdfkv.so"))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=240, cwd="/")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-3000:], r.stderr[-6000:])
    return json.loads(lines[-1][len("RESULT "):])


def test_remote_url_alone_stores_and_reads_back_through_lmcache(server, wheel_tree):
    tenant = "t-" + uuid.uuid4().hex[:12]
    url = f"dfkv://{server}?tenant={tenant}"
    chunk = 4242
    w = _engine(wheel_tree, "put", url, chunk)
    # one remote backend (no second one from a plugin list), and it is dfkv's
    assert w["backends"] == ["LocalCPUBackend", "RemoteBackend"]
    assert w["connector"] == "dfkv.connectors.lmcache_remote.DfkvRemoteConnector"
    assert w["members"] == f"{server}={server}"
    assert w["stored"] is True
    assert w["object"] == w["bytes"] and len(w["bytes"]) > 0  # the stored value is the raw chunk
    r = _engine(wheel_tree, "get", url, chunk)
    assert r["local_before"] is False and r["remote_has"] is True
    assert r["bytes"] == w["bytes"]  # byte-exact from dfkv, in a fresh process


def test_without_the_pth_lmcache_finds_no_dfkv_adapter(server, tmp_path):
    """The control: the same configuration with the dfkv source tree importable but the .pth
    not run gets no connector from LMCache (its RemoteBackend stays unconnected)."""
    code = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {PYTHON_DIR!r})
        import torch
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.event_manager import EventManager
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.storage_manager import StorageManager
        config = LMCacheEngineConfig.from_defaults(chunk_size=16, local_cpu=True, max_local_cpu_size=0.05,
                                                   remote_url="dfkv://{server}")
        meta = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(2, 2, 16, 2, 8),
                               chunk_size=16)
        sm = StorageManager(config, meta, EventManager())
        print("RESULT", sm.storage_backends["RemoteBackend"].connection is None)
        sm.close()
    ''')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=240, cwd=str(tmp_path))
    assert "_dfkv_lmcache_hook" not in r.stdout
    assert "RESULT True" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])
