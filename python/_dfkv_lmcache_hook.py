"""Lets LMCache find the dfkv remote connector for ``remote_url: dfkv://...`` on its own.

LMCache (0.5.6) resolves a ``remote_url`` by asking every adapter its ``ConnectorManager``
knows: the built-in ones, found by scanning the modules named ``*_adapter`` on the
``__path__`` of ``lmcache.v1.storage_backend.connector``, plus the ``remote_storage_plugins``
of the config (each of which also gets a RemoteBackend of its own, so listing dfkv there next
to ``remote_url`` writes every chunk twice). This module, run at interpreter start by the
wheel's ``dfkv-lmcache.pth``, adds ``dfkv/connectors/_lmcache_discovery`` to that package's
``__path__`` when it is imported, so LMCache's own scan finds ``DfkvConnectorAdapter``.

It imports nothing heavy (no dfkv, no LMCache, no torch) and costs one meta-path check per
import; any failure leaves imports untouched.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

TARGET = "lmcache.v1.storage_backend.connector"


def discovery_dir():
    """The dfkv directory to add, or None when dfkv is not importable here."""
    try:
        spec = importlib.util.find_spec("dfkv")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        d = os.path.join(base, "connectors", "_lmcache_discovery")
        if os.path.isfile(os.path.join(d, "dfkv_adapter.py")):
            return d
    return None


class LMCacheAdapterPath:
    """Meta-path finder that answers only for LMCache's connector package: the regular path
    finder's spec, with the dfkv directory appended to its submodule search locations."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.submodule_search_locations is not None:
            d = discovery_dir()
            if d is not None and d not in spec.submodule_search_locations:
                spec.submodule_search_locations.append(d)
        return spec

    @classmethod
    def invalidate_caches(cls):
        return None


def install() -> None:
    if not any(f is LMCacheAdapterPath for f in sys.meta_path):
        sys.meta_path.insert(0, LMCacheAdapterPath)
    mod = sys.modules.get(TARGET)  # already imported (hook installed late)
    if mod is not None:
        d = discovery_dir()
        if d is not None and d not in mod.__path__:
            mod.__path__.append(d)


try:
    install()
except Exception:  # never break interpreter start-up
    pass
