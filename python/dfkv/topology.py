"""The HLT1 topology an MDS serves (schema/topology.fbs): members, weights, rails, epochs.

``fetch("host:port")`` asks an MDS replica for a group's topology (an ``MdsRequest`` with
op ``ListTopology`` in a 64-byte ``RequestHeader`` frame, as ``go/internal/mdsclient`` does)
and decodes the answer with the generated FlatBuffers code in ``dfkv._fb``. ``decode_response``
and ``decode_topology`` take bytes directly (tools, tests, the connectors' rail affinity).

    python -m dfkv.topology --mds HOST:PORT[,HOST:PORT...] [--group G] [--json]

Hostile or truncated input is a ``ValueError`` naming what is wrong, never a crash and never
a silently shortened string: the Python FlatBuffers runtime does not bounds-check (slices
truncate, negative offsets wrap), so every offset, vector and string this module reads is
verified against the buffer first, and counts and lengths are held to the MDS limits of
``go/internal/wire/mds.go``. Every network wait has a deadline (``timeout`` per replica).

Needs the ``flatbuffers`` runtime (``pip install dfkv[topology]``); the rest of dfkv does not.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

try:
    import flatbuffers
except ImportError as e:  # pragma: no cover - exercised only without the extra installed
    raise ImportError("dfkv.topology needs the flatbuffers runtime: pip install 'dfkv[topology]' "
                      "(or pip install flatbuffers)") from e

from . import ring as _ring
from ._fb import common_generated as _common
from ._fb import control_generated as _ctl
from ._fb import topology_generated as _topo
from ._fb import wire_generated as _wire

__all__ = ["MdsError", "Member", "Rail", "Topology", "decode_response", "decode_topology",
           "encode_request", "fetch", "frame", "main"]

# flatc --gen-onefile leaves a table type that another schema file defines unresolved in
# the module that uses it (control's MdsResponse.Topology(), topology's Member.Config()):
# bind those names to the generated classes.
_ctl.Topology = _topo.Topology
_ctl.Member = _topo.Member
_ctl.KeyValue = _common.KeyValue
_topo.KeyValue = _common.KeyValue

# go/internal/wire: frame constants and the MDS limits (mds.go).
MAGIC = 0x314B4644  # "DFK1"
PROTOCOL_VERSION = 1
REQUEST_SIZE, RESPONSE_SIZE = 64, 32
TOPOLOGY_MAGIC = 0x31544C48  # "HLT1"
MAX_ID_LEN, MAX_STRING_LEN = 256, 4096
MAX_KVS, MAX_RAILS, MAX_MEMBERS = 64, 64, 4096
MAX_RESPONSE = 64 << 20
DEFAULT_GROUP = "default"

_STATUS = {getattr(_wire.Status, n): n for n in dir(_wire.Status) if not n.startswith("_")}


class MdsError(Exception):
    """The MDS could not be asked, or answered with a status other than Ok."""


# schema/topology.fbs RailHealth (the server's verdict on a rail).
HEALTH_UNKNOWN, HEALTH_HEALTHY, HEALTH_DOWN, HEALTH_QUARANTINED = 0, 1, 2, 3
_HEALTH_NAMES = {HEALTH_HEALTHY: "healthy", HEALTH_DOWN: "down", HEALTH_QUARANTINED: "quarantined"}


@dataclass(frozen=True)
class Rail:
    device: str
    port_state: int  # IB port state (4 = ACTIVE)
    phys_state: int  # IB physical state (5 = LinkUp)
    query_ok: bool
    port: int = 0  # 1-based port number (0 = unknown)
    numa_node: int = -1  # -1 = unknown
    tier: int = 0  # selection tier (0 = preferred)
    generation: int = 0  # bumps whenever the published health changes
    health: int = HEALTH_UNKNOWN

    @property
    def state(self) -> str:
        """One word, as go/internal/wire Rail.State: healthy, down, quarantined; for a writer
        that predates ``health``: up, down or unqueried from the port."""
        if self.health == HEALTH_UNKNOWN:
            if not self.query_ok:
                return "unqueried"
            return "up" if self.port_state == 4 else "down"
        return _HEALTH_NAMES.get(self.health, f"unknown(RailHealth({self.health}))")

    @property
    def usable(self) -> bool:
        """Whether peers may use the rail (as go/internal/wire Rail.Usable)."""
        if self.health == HEALTH_UNKNOWN:
            return self.query_ok and self.port_state == 4
        return self.health == HEALTH_HEALTHY


@dataclass(frozen=True)
class Member:
    id: str
    address: str
    weight: int
    eligible: bool
    version: str
    config: Tuple[Tuple[str, str], ...] = ()
    rails: Tuple[Rail, ...] = ()


@dataclass(frozen=True)
class Topology:
    members_epoch: int
    topology_epoch: int
    members: Tuple[Member, ...] = field(default_factory=tuple)

    def ring(self) -> _ring.Ring:
        """The placement ring of the eligible members (what clients route by)."""
        return _ring.Ring([(m.id, m.weight) for m in self.members if m.eligible])

    def to_json(self, group: str = DEFAULT_GROUP) -> dict:
        """The shape ``dfkvctl ring --json`` prints (rails with snake_case keys)."""
        eligible = [m for m in self.members if m.eligible]
        shares = self.ring().shares() if eligible else {}
        return {
            "group": group,
            "members_epoch": f"{self.members_epoch:016x}",
            "topology_epoch": f"{self.topology_epoch:016x}",
            "members": [{
                "id": m.id, "address": m.address, "weight": m.weight, "eligible": m.eligible,
                "share": shares.get(m.id, 0.0), "version": m.version, "config": dict(m.config),
                "rails": [{"device": r.device, "port": r.port, "port_state": r.port_state,
                           "phys_state": r.phys_state, "query_ok": r.query_ok, "numa_node": r.numa_node,
                           "tier": r.tier, "generation": r.generation, "state": r.state} for r in m.rails],
            } for m in self.members],
        }


# ---------------------------------------------------------------------------------------
# Verification. Slots are vtable offsets (4 + 2 * field index in the schema); kinds are a
# scalar size in bytes, "str", ("table", name) or ("vec", name, limit). Only the fields this
# module reads are listed (MdsResponse.clients is never touched). test_topology.py checks
# the slots and kinds against schema/*.fbs.

_TABLES: Dict[str, Dict[int, object]] = {
    "MdsResponse": {4: 1, 6: "str", 8: 4, 10: ("table", "Topology")},
    "Topology": {4: 4, 6: 8, 8: 8, 10: ("vec", "Member", MAX_MEMBERS)},
    "Member": {4: "str", 6: "str", 8: 4, 10: 1, 12: "str", 14: ("vec", "KeyValue", MAX_KVS),
               16: ("vec", "Rail", MAX_RAILS)},
    "KeyValue": {4: "str", 6: "str"},
    "Rail": {4: "str", 6: 1, 8: 1, 10: 1, 12: 1, 14: 2, 16: 1, 18: 4, 20: 1},
}

_U16, _U32, _I32 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")


class _Verifier:
    def __init__(self, buf: bytes):
        self.buf, self.n = buf, len(buf)

    def _need(self, off: int, size: int, what: str) -> None:
        if off < 0 or off + size > self.n:
            raise ValueError(f"{what} at offset {off} (+{size}) is outside the {self.n}-byte buffer")

    def _u32(self, off: int, what: str) -> int:
        self._need(off, 4, what)
        return _U32.unpack_from(self.buf, off)[0]

    def table(self, pos: int, name: str) -> None:
        self._need(pos, 4, f"{name} table")
        vt = pos - _I32.unpack_from(self.buf, pos)[0]
        self._need(vt, 4, f"{name} vtable")
        vt_len, t_len = _U16.unpack_from(self.buf, vt)[0], _U16.unpack_from(self.buf, vt + 2)[0]
        if vt_len < 4 or vt_len % 2 or t_len < 4:
            raise ValueError(f"{name}: malformed vtable (length {vt_len}, table length {t_len})")
        self._need(vt, vt_len, f"{name} vtable")
        self._need(pos, t_len, f"{name} table")
        for slot, kind in _TABLES[name].items():
            if slot + 2 > vt_len:
                continue  # an older writer: the field is absent (default)
            fo = _U16.unpack_from(self.buf, vt + slot)[0]
            if fo == 0:
                continue
            size = kind if isinstance(kind, int) else 4
            if fo + size > t_len:
                raise ValueError(f"{name}: field at slot {slot} runs past its table")
            if isinstance(kind, int):
                continue
            at = pos + fo
            target = at + self._u32(at, f"{name} offset")
            if kind == "str":
                self._string(target, name)
            elif kind[0] == "table":
                self.table(target, kind[1])
            else:
                self._vector(target, kind[1], kind[2])

    def _string(self, off: int, owner: str) -> None:
        n = self._u32(off, f"{owner} string length")
        self._need(off + 4, n, f"{owner} string")

    def _vector(self, off: int, elem: str, limit: int) -> None:
        count = self._u32(off, f"{elem} vector length")
        if count > limit:
            raise ValueError(f"{elem} count {count} exceeds the limit {limit}")
        self._need(off + 4, 4 * count, f"{elem} vector")
        for i in range(count):
            at = off + 4 + 4 * i
            self.table(at + self._u32(at, f"{elem} offset"), elem)


def _root(buf: Union[bytes, bytearray, memoryview], name: str) -> Tuple[bytes, int]:
    b = bytes(buf)
    if len(b) < 8:
        raise ValueError(f"{name}: {len(b)} bytes is too short for a FlatBuffers table")
    root = _U32.unpack_from(b, 0)[0]
    _Verifier(b).table(root, name)
    return b, root


def _str(raw: Optional[bytes], what: str, limit: int) -> str:
    raw = raw or b""
    if len(raw) > limit:
        raise ValueError(f"{what} length {len(raw)} exceeds {limit}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8: {e}") from None


def _member(m: "_topo.Member") -> Member:
    config = []
    for i in range(m.ConfigLength()):
        kv = m.Config(i)
        config.append((_str(kv.Key(), "config key", MAX_STRING_LEN), _str(kv.Value(), "config value", MAX_STRING_LEN)))
    rails = []
    for i in range(m.RailsLength()):
        r = m.Rails(i)
        rails.append(Rail(_str(r.Device(), "rail device", MAX_STRING_LEN), r.PortState(), r.PhysState(),
                          bool(r.QueryOk()), r.Port(), r.NumaNode(), r.Tier(), r.Generation(), r.Health()))
    return Member(id=_str(m.Id(), "member id", MAX_ID_LEN), address=_str(m.Address(), "address", MAX_STRING_LEN),
                  weight=m.Weight(), eligible=bool(m.Eligible()), version=_str(m.Version(), "version", MAX_STRING_LEN),
                  config=tuple(config), rails=tuple(rails))


def _topology(t: "_topo.Topology") -> Topology:
    if t.Magic() != TOPOLOGY_MAGIC:
        raise ValueError(f"topology magic {t.Magic():#x}, want HLT1 ({TOPOLOGY_MAGIC:#x})")
    return Topology(t.MembersEpoch(), t.TopologyEpoch(), tuple(_member(t.Members(i)) for i in range(t.MembersLength())))


def decode_topology(buf: Union[bytes, bytearray, memoryview]) -> Topology:
    """A standalone Topology table (HLT1). ValueError when it is malformed."""
    b, root = _root(buf, "Topology")
    t = _topo.Topology()
    t.Init(b, root)
    return _topology(t)


def decode_response(buf: Union[bytes, bytearray, memoryview]) -> Tuple[str, str, Optional[Topology]]:
    """An MdsResponse table: (status name, error text, topology or None). ValueError when it
    is malformed or its status is unknown."""
    b, root = _root(buf, "MdsResponse")
    r = _ctl.MdsResponse()
    r.Init(b, root)
    status = _STATUS.get(r.Status())
    if status is None:
        raise ValueError(f"unknown status {r.Status()}")
    t = r.Topology()
    return status, _str(r.Error(), "error", MAX_STRING_LEN), _topology(t) if t is not None else None


# ---------------------------------------------------------------------------------------
# The call


def encode_request(group: str = DEFAULT_GROUP, token: Optional[str] = None, known_members_epoch: int = 0) -> bytes:
    """A ListTopology request frame: RequestHeader (op Mds) + MdsRequest table."""
    if not group or len(group.encode()) > MAX_ID_LEN:
        raise ValueError(f"group must be 1..{MAX_ID_LEN} bytes")
    b = flatbuffers.Builder(128)
    g = b.CreateString(group)
    tok = b.CreateString(token) if token else None
    _ctl.MdsRequestStart(b)
    _ctl.MdsRequestAddOp(b, _ctl.MdsOp.ListTopology)
    _ctl.MdsRequestAddGroup(b, g)
    if tok is not None:
        _ctl.MdsRequestAddToken(b, tok)
    _ctl.MdsRequestAddKnownMembersEpoch(b, known_members_epoch)
    b.Finish(_ctl.MdsRequestEnd(b))
    return frame(bytes(b.Output()))


def frame(payload: bytes) -> bytes:
    """An MDS request frame: the 64-byte RequestHeader (op Mds) and the MdsRequest table."""
    h = flatbuffers.Builder(REQUEST_SIZE)
    _wire.CreateRequestHeader(h, MAGIC, _wire.Op.Mds, 0, PROTOCOL_VERSION, 0, 0, 0, 0, 0, 0, 0, len(payload))
    return bytes(h.Bytes[h.Head():]) + payload  # a struct alone: exactly its 64 bytes


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        if k == 0:
            raise MdsError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _call(endpoint: str, frame: bytes, timeout: float) -> bytes:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"MDS endpoint {endpoint!r}: want host:port")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(frame)
        hdr = _recv_exact(s, RESPONSE_SIZE)
        r = _wire.ResponseHeader()
        r.Init(hdr, 0)
        if r.Magic() != MAGIC:
            raise MdsError(f"reply magic {r.Magic():#x}: not a dfkv MDS")
        if r.Version() != PROTOCOL_VERSION:
            raise MdsError(f"reply protocol version {r.Version()}, want {PROTOCOL_VERSION}")
        if r.PayloadLen() > MAX_RESPONSE:
            raise MdsError(f"reply of {r.PayloadLen()} bytes exceeds {MAX_RESPONSE}")
        body = _recv_exact(s, r.PayloadLen())
        if r.Op() != _wire.Op.Mds:
            raise MdsError(f"reply op {r.Op()} status {r.Status()}: is this an MDS port?")
        if r.Status() != _wire.Status.Ok:
            raise MdsError(f"frame refused with status {_STATUS.get(r.Status(), r.Status())}")
        return body


def fetch(endpoints: Union[str, Sequence[str]], group: str = DEFAULT_GROUP, *, timeout: float = 2.0,
          token: Optional[str] = None) -> Topology:
    """Ask the MDS replicas (a "h:p,h:p" string or a list) in order for ``group``'s topology;
    the first Ok answer wins. ``timeout`` bounds each replica's connect, send and reply."""
    eps = [e.strip() for e in (endpoints.split(",") if isinstance(endpoints, str) else endpoints) if e.strip()]
    if not eps:
        raise ValueError("no MDS endpoints")
    frame = encode_request(group, token)
    errs: List[str] = []
    for ep in eps:
        try:
            status, err, topo = decode_response(_call(ep, frame, timeout))
        except (OSError, MdsError, ValueError) as e:
            errs.append(f"{ep}: {e}")
            continue
        if status == "Ok":
            return topo if topo is not None else Topology(0, 0, ())
        if status in ("Invalid", "Forbidden", "NotFound"):
            raise MdsError(f"{ep}: {status}: {err}")  # every replica would say the same
        errs.append(f"{ep}: {status}: {err}")
    raise MdsError("no MDS replica answered: " + "; ".join(errs))


def _render(topo: Topology, group: str) -> str:
    j = topo.to_json(group)
    lines = [f"group {group}: {len(topo.members)} members (members epoch {j['members_epoch']}, "
             f"topology epoch {j['topology_epoch']})"]
    rows = [("ID", "ADDRESS", "WEIGHT", "SHARE", "ELIGIBLE", "RAILS", "VERSION")]
    for m in j["members"]:
        rails = ",".join(f"{r['device']}:{r['port_state']}/{r['phys_state']}:{r['state']}" for r in m["rails"]) or "-"
        rows.append((m["id"], m["address"], str(m["weight"]), f"{100 * m['share']:.1f}%",
                     str(m["eligible"]).lower(), rails, m["version"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def main(argv: Optional[Iterable[str]] = None) -> int:
    """The ``python -m dfkv.topology`` command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m dfkv.topology",
                                 description="Print the HLT1 topology (members, weights, rails, epochs) an MDS serves.")
    ap.add_argument("--mds", required=True, help="MDS replicas host:port[,host:port...]")
    ap.add_argument("--group", default=DEFAULT_GROUP, help="MDS group (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="JSON output (the shape of dfkvctl ring --json)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per replica (default: %(default)s)")
    ap.add_argument("--token", default=None, help="tenant token, for an MDS run with --auth-tokens")
    a = ap.parse_args(None if argv is None else list(argv))
    try:
        topo = fetch(a.mds, a.group, timeout=a.timeout, token=a.token)
    except (MdsError, ValueError) as e:
        print(f"dfkv.topology: {e}", file=sys.stderr)
        return 1
    print(json.dumps(topo.to_json(a.group), indent=2) if a.json else _render(topo, a.group))
    return 0


if __name__ == "__main__":
    sys.exit(main())
