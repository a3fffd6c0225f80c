"""LMCache built-in discovery entry for ``dfkv://`` remote URLs.

Imported by LMCache as ``lmcache.v1.storage_backend.connector.dfkv_adapter`` (its adapter
scan accepts adapters imported into a module); the adapter itself lives in
``dfkv.connectors.lmcache_remote``.
"""

from dfkv.connectors.lmcache_remote import DfkvConnectorAdapter

__all__ = ["DfkvConnectorAdapter"]
