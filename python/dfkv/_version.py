"""Version of the dfkv Python package (the library reports its own via dfkv.version())."""

__version__ = "0.1.0"
