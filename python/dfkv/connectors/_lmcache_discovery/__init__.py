"""A directory LMCache's built-in adapter discovery scans (see ``_dfkv_lmcache_hook``).

``_dfkv_lmcache_hook`` (installed with the wheel, run at interpreter start through
``dfkv-lmcache.pth``) appends this directory to the ``__path__`` of
``lmcache.v1.storage_backend.connector`` when LMCache imports that package. LMCache's
``ConnectorManager`` lists the modules named ``*_adapter`` on that path and instantiates every
``ConnectorAdapter`` they hold, so ``dfkv_adapter`` here makes ``remote_url: dfkv://...`` work
by itself, with no ``remote_storage_plugins`` entry (which would add a second backend).
"""
