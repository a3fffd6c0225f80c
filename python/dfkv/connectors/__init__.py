"""Engine connectors for dfkv: thin adapters from inference engines to ``dfkv.Client``.

* ``dfkv.connectors.sglang_hicache.DfkvHiCacheStorage`` — SGLang HiCache L3 backend
  (``--hicache-storage-backend dynamic``).
* ``dfkv.connectors.lmcache_remote.DfkvConnectorAdapter`` / ``DfkvRemoteConnector`` — LMCache
  remote storage plugin (``dfkv://`` URLs, ``plugin://dfkv``).
* ``dfkv.connectors.vllm_v1.DfkvConnector`` — vLLM ``KVConnectorBase_V1`` + ``SupportsHMA``
  (``kv_connector_module_path``).

Importing this package imports no engine: each connector module imports its own engine's
base classes (they must subclass them), so import only the module of the engine you run.
Nothing here loads ``libdfkv.so`` at import time either; every connector opens its client
lazily, in the process that does the I/O (engines fork workers; see SPEC §12).

Configuration keys are shared by all three connectors (see ``_common.ClientConfig`` and
docs/CONNECTORS.md §3-5).
"""

from ._common import ClientConfig, LazyClient

__all__ = ["ClientConfig", "LazyClient"]
