"""dfkv identity: object ids, tenant hashes and the structured namespace / object-key codec.

Bit-exact twin of ``go/identity`` (checked by the shared golden vectors in
``testdata/golden/identity.json``). Changing anything here changes every stored key.

Hashes
------
* ``object_id(namespace, key)``: SHA-256 over ``u64le(len(ns)) ns u64le(len(key)) key``;
  ``hi`` = big-endian u64 of digest[0:8], ``lo`` = digest[8:16]. Node placement uses ``hi``,
  disk placement inside a node uses ``lo``.
* ``tenant_hash(tenant)``: big-endian u64 of SHA-256(``"DFKVTENANT1" u64le(len) tenant``)[0:8].

Structured encodings (version 1)
--------------------------------
Connectors do not invent ad-hoc string keys: they describe *what* a value is and this codec
turns the description into bytes. Both encodings are deterministic (one input, one byte
string), self-delimiting (every variable field is length-prefixed, so no field can bleed into
the next), versioned by an 8-byte magic, and little-endian. Decoders reject unknown magics,
bad values and trailing bytes.

Primitives::

    u8 / u32 / u64   unsigned little-endian integers of 1 / 4 / 8 bytes
    i32              signed (two's complement) little-endian, 4 bytes
    blob(X)          u32 len(X) || X          (raw bytes)
    text(S)          blob(UTF-8 of S)

Namespace (``Namespace.encode()``)::

    "DFKVNS1\\0"                           8 bytes magic
    text   tenant        0..256  bytes     also hashed separately into the wire tenant hash
    text   model         1..1024 bytes     e.g. "meta-llama/Llama-3.1-8B-Instruct"
    text   revision      0..256  bytes     model revision / weights hash ("" = unspecified)
    text   layout        1..128  bytes     connector layout id, e.g. "sglang-hicache/raw-v1"
    text   dtype         1..32   bytes     e.g. "bfloat16", "fp8_e4m3"
    blob   fingerprint   0..64   bytes     opaque layout fingerprint (e.g. hash of KV shapes)
    u64    page_tokens   >= 1              tokens per page / chunk
    u64    page_bytes    >= 0              bytes per page (0 = variable / unspecified)
    u32    n_geometry    0..32             extra named geometry values, then n times:
      text name   1..64 bytes of [a-z0-9_.]  strictly ascending (bytewise) => canonical
      u64  value
    u32    dp, tp, pcp, dcp, pp            topology sizes, each 1..2^31-1 (1 = unused)

Object key (``ObjectKey.encode()``)::

    "DFKVOK1\\0"                           8 bytes magic
    text   pool          1..64 bytes       memory pool, e.g. "kv", "mamba", "swa", "indexer"
    blob   page_hash     1..256 bytes      the engine's full page/chunk hash (str => UTF-8)
    5 x (u32 size, i32 rank)               dp, tp, pcp, dcp, pp coordinates:
                                           size 1..2^31-1, rank -1..size-1, -1 = replicated
                                           (one object shared by every rank of that axis)
    u32    cache_group                     vLLM kv_cache_group / HiCache pool group
    text   component     1..32 bytes       "k", "v", "kv", "latent", ...
    u8     has_sg        0 or 1            scatter-gather suffix follows when 1:
      u32  first                           first segment index covered (e.g. first layer)
      u32  count         >= 1              number of segments concatenated in the value
      u64  seg_bytes     >= 1              bytes per segment

Errors: wrong Python types raise ``TypeError``; out-of-range values, over-long fields,
ranks >= size, duplicate geometry names, bad magics and truncated/trailing bytes raise
``ValueError``.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, Union

__all__ = [
    "ObjectId",
    "object_id",
    "tenant_hash",
    "NAMESPACE_MAGIC",
    "OBJECT_KEY_MAGIC",
    "REPLICATED",
    "Namespace",
    "ObjectKey",
    "ScatterGather",
    "encode_namespace",
    "encode_object_key",
    "decode_namespace",
    "decode_object_key",
    "key_builder",
]

BytesLike = Union[bytes, bytearray, memoryview]

_TENANT_DOMAIN = b"DFKVTENANT1"
_U64LE = struct.Struct("<Q")


class ObjectId(NamedTuple):
    """128-bit object id as (hi, lo); ``hex()`` matches Go's ``ObjectID.String()``."""

    hi: int
    lo: int

    def hex(self) -> str:
        """The id as 32 hex digits."""
        return f"{self.hi:016x}{self.lo:016x}"


def object_id(namespace: BytesLike, key: BytesLike) -> ObjectId:
    """Object id of ``key`` within ``namespace`` (both arbitrary bytes, NUL allowed)."""
    ns = bytes(namespace)
    k = bytes(key)
    h = hashlib.sha256()
    h.update(_U64LE.pack(len(ns)))
    h.update(ns)
    h.update(_U64LE.pack(len(k)))
    h.update(k)
    d = h.digest()
    return ObjectId(int.from_bytes(d[0:8], "big"), int.from_bytes(d[8:16], "big"))


def tenant_hash(tenant: Union[BytesLike, str]) -> int:
    """64-bit tenant hash carried on the wire (str tenants are UTF-8 encoded)."""
    t = tenant.encode("utf-8") if isinstance(tenant, str) else bytes(tenant)
    h = hashlib.sha256()
    h.update(_TENANT_DOMAIN)
    h.update(_U64LE.pack(len(t)))
    h.update(t)
    return int.from_bytes(h.digest()[0:8], "big")


# ---------------------------------------------------------------------------------------
# Structured codec

NAMESPACE_MAGIC = b"DFKVNS1\x00"
OBJECT_KEY_MAGIC = b"DFKVOK1\x00"
REPLICATED = -1

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_COORD = struct.Struct("<Ii")
_SG = struct.Struct("<IIQ")
_TOPO = struct.Struct("<IIIII")

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
_SIZE_MAX = (1 << 31) - 1  # sizes share a range with i32 ranks
_MAX_GEOMETRY = 32
_GEOMETRY_NAME = re.compile(rb"[a-z0-9_.]{1,64}\Z")
_AXES = ("dp", "tp", "pcp", "dcp", "pp")


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    # bool is an int subclass; True as a size is always a bug.
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}={v} out of range {lo}..{hi}")
    return v


def _text(name: str, v: Any, lo: int, hi: int) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    b = v.encode("utf-8")
    if not lo <= len(b) <= hi:
        raise ValueError(f"{name} is {len(b)} bytes (UTF-8); allowed {lo}..{hi}")
    return b


def _blob(name: str, v: Any, lo: int, hi: int, allow_str: bool = False) -> bytes:
    if allow_str and isinstance(v, str):
        b = v.encode("utf-8")
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
    else:
        raise TypeError(f"{name} must be bytes-like, not {type(v).__name__}")
    if not lo <= len(b) <= hi:
        raise ValueError(f"{name} is {len(b)} bytes; allowed {lo}..{hi}")
    return b


def _lp(b: bytes) -> bytes:
    return _U32.pack(len(b)) + b


def _coord(name: str, v: Any) -> Tuple[int, int]:
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise TypeError(f"{name} must be a (size, rank) pair")
    size = _int(f"{name} size", v[0], 1, _SIZE_MAX)
    rank = _int(f"{name} rank", v[1], -1, _SIZE_MAX)
    if rank >= size:
        raise ValueError(f"{name} rank {rank} >= size {size}")
    return size, rank


class _Reader:
    """Bounds-checked cursor for the decoders; every short read is a ValueError."""

    def __init__(self, data: BytesLike, what: str):
        self.b = bytes(data)
        self.i = 0
        self.what = what

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.b):
            raise ValueError(f"{self.what}: truncated at byte {self.i} (need {n} more)")
        out = self.b[self.i : self.i + n]
        self.i += n
        return out

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack(self.take(s.size))

    def blob(self, name: str, lo: int, hi: int) -> bytes:
        (n,) = self.unpack(_U32)
        if not lo <= n <= hi:
            raise ValueError(f"{self.what}: {name} length {n} out of range {lo}..{hi}")
        return self.take(n)

    def text(self, name: str, lo: int, hi: int) -> str:
        try:
            return self.blob(name, lo, hi).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.what}: {name} is not UTF-8") from e

    def done(self) -> None:
        if self.i != len(self.b):
            raise ValueError(f"{self.what}: {len(self.b) - self.i} trailing bytes")


@dataclass(frozen=True)
class Namespace:
    """Structured namespace: which model/layout/geometry the cached bytes belong to."""

    model: str
    layout: str
    dtype: str
    page_tokens: int
    page_bytes: int = 0
    tenant: str = ""
    revision: str = ""
    fingerprint: bytes = b""
    geometry: Mapping[str, int] = field(default_factory=dict)
    dp: int = 1
    tp: int = 1
    pcp: int = 1
    dcp: int = 1
    pp: int = 1

    def encode(self) -> bytes:
        """The namespace in its binary form (the byte format in the module docstring)."""
        out = [
            NAMESPACE_MAGIC,
            _lp(_text("tenant", self.tenant, 0, 256)),
            _lp(_text("model", self.model, 1, 1024)),
            _lp(_text("revision", self.revision, 0, 256)),
            _lp(_text("layout", self.layout, 1, 128)),
            _lp(_text("dtype", self.dtype, 1, 32)),
            _lp(_blob("fingerprint", self.fingerprint, 0, 64)),
            _U64LE.pack(_int("page_tokens", self.page_tokens, 1, _U64_MAX)),
            _U64LE.pack(_int("page_bytes", self.page_bytes, 0, _U64_MAX)),
        ]
        if not isinstance(self.geometry, Mapping):
            raise TypeError("geometry must be a mapping of name -> int")
        if len(self.geometry) > _MAX_GEOMETRY:
            raise ValueError(f"geometry has {len(self.geometry)} entries; at most {_MAX_GEOMETRY}")
        items = []
        for name, value in self.geometry.items():
            nb = _text("geometry name", name, 1, 64)
            if not _GEOMETRY_NAME.match(nb):
                raise ValueError(f"geometry name {name!r} must match [a-z0-9_.]{{1,64}}")
            items.append((nb, _int(f"geometry[{name}]", value, 0, _U64_MAX)))
        items.sort()  # canonical order: the mapping's iteration order must not matter
        out.append(_U32.pack(len(items)))
        for nb, value in items:
            out.append(_lp(nb))
            out.append(_U64LE.pack(value))
        out.append(_TOPO.pack(*(_int(a, getattr(self, a), 1, _SIZE_MAX) for a in _AXES)))
        return b"".join(out)

    @classmethod
    def decode(cls, data: BytesLike) -> "Namespace":
        """Parse the binary form ``encode`` produces; ValueError on malformed input."""
        r = _Reader(data, "namespace")
        if r.take(8) != NAMESPACE_MAGIC:
            raise ValueError("namespace: bad magic (not a DFKVNS1 namespace)")
        tenant = r.text("tenant", 0, 256)
        model = r.text("model", 1, 1024)
        revision = r.text("revision", 0, 256)
        layout = r.text("layout", 1, 128)
        dtype = r.text("dtype", 1, 32)
        fingerprint = r.blob("fingerprint", 0, 64)
        (page_tokens,) = r.unpack(_U64LE)
        (page_bytes,) = r.unpack(_U64LE)
        (n,) = r.unpack(_U32)
        if n > _MAX_GEOMETRY:
            raise ValueError(f"namespace: {n} geometry entries; at most {_MAX_GEOMETRY}")
        geometry: Dict[str, int] = {}
        prev = b""
        for _ in range(n):
            nb = r.blob("geometry name", 1, 64)
            if not _GEOMETRY_NAME.match(nb) or nb <= prev:
                raise ValueError("namespace: geometry names must be [a-z0-9_.] and strictly ascending")
            prev = nb
            (geometry[nb.decode("ascii")],) = r.unpack(_U64LE)
        topo = r.unpack(_TOPO)
        r.done()
        ns = cls(model=model, layout=layout, dtype=dtype, page_tokens=page_tokens,
                 page_bytes=page_bytes, tenant=tenant, revision=revision,
                 fingerprint=fingerprint, geometry=geometry, **dict(zip(_AXES, topo)))
        ns.encode()  # re-validate ranges (page_tokens >= 1, sizes >= 1) with one code path
        return ns

    def to_json(self) -> Dict[str, Any]:
        """JSON-friendly form (bytes as hex) used by the golden vectors."""
        return {
            "tenant": self.tenant,
            "model": self.model,
            "revision": self.revision,
            "layout": self.layout,
            "dtype": self.dtype,
            "fingerprint_hex": bytes(self.fingerprint).hex(),
            "page_tokens": self.page_tokens,
            "page_bytes": self.page_bytes,
            "geometry": dict(self.geometry),
            "topology": {a: getattr(self, a) for a in _AXES},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Namespace":
        """Build from the dict ``to_json`` produces."""
        topo = d.get("topology", {})
        return cls(
            tenant=d.get("tenant", ""),
            model=d["model"],
            revision=d.get("revision", ""),
            layout=d["layout"],
            dtype=d["dtype"],
            fingerprint=bytes.fromhex(d.get("fingerprint_hex", "")),
            page_tokens=d["page_tokens"],
            page_bytes=d.get("page_bytes", 0),
            geometry=dict(d.get("geometry", {})),
            **{a: topo.get(a, 1) for a in _AXES},
        )


@dataclass(frozen=True)
class ScatterGather:
    """Scatter-gather suffix: the value is ``count`` segments of ``seg_bytes`` bytes each,
    covering segment indices ``first .. first+count-1`` (e.g. a layer range)."""

    first: int
    count: int
    seg_bytes: int

    def encode(self) -> bytes:
        """The scatter-gather descriptor in its binary form."""
        return _SG.pack(_int("sg.first", self.first, 0, _U32_MAX),
                        _int("sg.count", self.count, 1, _U32_MAX),
                        _int("sg.seg_bytes", self.seg_bytes, 1, _U64_MAX))


Coord = Tuple[int, int]


@dataclass(frozen=True)
class ObjectKey:
    """Structured object key: which page, shard and component a value holds."""

    pool: str
    page_hash: Union[bytes, str]
    component: str
    dp: Coord = (1, 0)
    tp: Coord = (1, 0)
    pcp: Coord = (1, 0)
    dcp: Coord = (1, 0)
    pp: Coord = (1, 0)
    cache_group: int = 0
    sg: Optional[ScatterGather] = None

    def _parts(self) -> Tuple[bytes, bytes]:
        """(prefix, suffix) around the page-hash blob, so key_builder can reuse them."""
        prefix = OBJECT_KEY_MAGIC + _lp(_text("pool", self.pool, 1, 64))
        suffix = [_COORD.pack(*_coord(a, getattr(self, a))) for a in _AXES]
        suffix.append(_U32.pack(_int("cache_group", self.cache_group, 0, _U32_MAX)))
        suffix.append(_lp(_text("component", self.component, 1, 32)))
        if self.sg is None:
            suffix.append(_U8.pack(0))
        else:
            if not isinstance(self.sg, ScatterGather):
                raise TypeError("sg must be a ScatterGather or None")
            suffix.append(_U8.pack(1) + self.sg.encode())
        return prefix, b"".join(suffix)

    def encode(self) -> bytes:
        """The object key in its binary form (the byte format in the module docstring)."""
        prefix, suffix = self._parts()
        return prefix + _lp(_blob("page_hash", self.page_hash, 1, 256, allow_str=True)) + suffix

    @classmethod
    def decode(cls, data: BytesLike) -> "ObjectKey":
        """Parse the binary form ``encode`` produces; ValueError on malformed input."""
        r = _Reader(data, "object key")
        if r.take(8) != OBJECT_KEY_MAGIC:
            raise ValueError("object key: bad magic (not a DFKVOK1 key)")
        pool = r.text("pool", 1, 64)
        page_hash = r.blob("page_hash", 1, 256)
        coords = {a: r.unpack(_COORD) for a in _AXES}
        (cache_group,) = r.unpack(_U32)
        component = r.text("component", 1, 32)
        (flag,) = r.unpack(_U8)
        if flag == 0:
            sg = None
        elif flag == 1:
            sg = ScatterGather(*r.unpack(_SG))
        else:
            raise ValueError(f"object key: bad scatter-gather flag {flag}")
        r.done()
        key = cls(pool=pool, page_hash=page_hash, component=component,
                  cache_group=cache_group, sg=sg, **coords)
        key.encode()  # re-validate ranges (rank < size, sg.count >= 1) with one code path
        return key

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict of the fields (what ``from_json`` reads)."""
        ph = self.page_hash.encode("utf-8") if isinstance(self.page_hash, str) else bytes(self.page_hash)
        d: Dict[str, Any] = {"pool": self.pool, "page_hash_hex": ph.hex()}
        d.update({a: list(getattr(self, a)) for a in _AXES})
        d["cache_group"] = self.cache_group
        d["component"] = self.component
        d["sg"] = None if self.sg is None else {
            "first": self.sg.first, "count": self.sg.count, "seg_bytes": self.sg.seg_bytes}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ObjectKey":
        """Build from the dict ``to_json`` produces."""
        sg = d.get("sg")
        return cls(
            pool=d["pool"],
            page_hash=bytes.fromhex(d["page_hash_hex"]),
            component=d["component"],
            cache_group=d.get("cache_group", 0),
            sg=None if sg is None else ScatterGather(sg["first"], sg["count"], sg["seg_bytes"]),
            **{a: tuple(d.get(a, (1, 0))) for a in _AXES},
        )


def encode_namespace(**fields: Any) -> bytes:
    """``Namespace(**fields).encode()``."""
    return Namespace(**fields).encode()


def encode_object_key(**fields: Any) -> bytes:
    """``ObjectKey(**fields).encode()``."""
    return ObjectKey(**fields).encode()


def decode_namespace(data: BytesLike) -> Namespace:
    """``Namespace.decode(data)``."""
    return Namespace.decode(data)


def decode_object_key(data: BytesLike) -> ObjectKey:
    """``ObjectKey.decode(data)``."""
    return ObjectKey.decode(data)


def key_builder(**fields: Any) -> Callable[[Union[bytes, str]], bytes]:
    """Validate every field except ``page_hash`` once and return ``page_hash -> key bytes``.

    Connectors encode thousands of keys per batch that differ only in the page hash; the
    returned function just frames the hash between precomputed prefix and suffix bytes.
    """
    prefix, suffix = ObjectKey(page_hash=b"\x00", **fields)._parts()

    def build(page_hash: Union[bytes, str]) -> bytes:
        return prefix + _lp(_blob("page_hash", page_hash, 1, 256, allow_str=True)) + suffix

    return build
