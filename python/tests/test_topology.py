"""dfkv.topology: the HLT1 topology decoded with the generated FlatBuffers code.

Against a real dfkv_mds (embedded etcd) and a real dfkv_server, the decoded members, weights,
rails and epochs equal what ``dfkvctl ring --json`` (the Go decoder) reports; a member with
rails and config is registered through a RegisterMember request this file builds with the
generated Python builders, so the Go side also decodes Python-encoded tables. Hostile
bytes (truncations, bit flips, garbage, absurd counts) are a ValueError, never another
exception and never a different decode.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import time

import flatbuffers
import pytest
from conftest import PYTHON_DIR, REPO
from test_mds import ctl_json, free_port, run_cluster

from dfkv import topology
from dfkv._fb import common_generated as C
from dfkv._fb import control_generated as K
from dfkv._fb import topology_generated as T

# ---------------------------------------------------------------------------------------
# Encoding helpers (generated builders): the inputs of the tests, never their expectations.


def build_member(b: flatbuffers.Builder, m: topology.Member) -> int:
    strs = {k: b.CreateString(v) for k, v in (("id", m.id), ("addr", m.address), ("ver", m.version))}
    kvs = []
    for k, v in m.config:
        ko, vo = b.CreateString(k), b.CreateString(v)
        C.KeyValueStart(b)
        C.KeyValueAddKey(b, ko)
        C.KeyValueAddValue(b, vo)
        kvs.append(C.KeyValueEnd(b))
    rails = []
    for r in m.rails:
        d = b.CreateString(r.device)
        T.RailStart(b)
        T.RailAddDevice(b, d)
        T.RailAddPortState(b, r.port_state)
        T.RailAddPhysState(b, r.phys_state)
        T.RailAddQueryOk(b, r.query_ok)
        T.RailAddPort(b, r.port)
        T.RailAddNumaNode(b, r.numa_node)
        T.RailAddTier(b, r.tier)
        T.RailAddGeneration(b, r.generation)
        T.RailAddHealth(b, r.health)
        rails.append(T.RailEnd(b))

    def vec(start, items):
        start(b, len(items))
        for o in reversed(items):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    cv, rv = vec(T.MemberStartConfigVector, kvs), vec(T.MemberStartRailsVector, rails)
    T.MemberStart(b)
    T.MemberAddId(b, strs["id"])
    T.MemberAddAddress(b, strs["addr"])
    T.MemberAddWeight(b, m.weight)
    T.MemberAddEligible(b, m.eligible)
    T.MemberAddVersion(b, strs["ver"])
    T.MemberAddConfig(b, cv)
    T.MemberAddRails(b, rv)
    return T.MemberEnd(b)


def build_topology(b: flatbuffers.Builder, t: topology.Topology, magic: int = topology.TOPOLOGY_MAGIC) -> int:
    ms = [build_member(b, m) for m in t.members]
    T.TopologyStartMembersVector(b, len(ms))
    for o in reversed(ms):
        b.PrependUOffsetTRelative(o)
    mv = b.EndVector()
    T.TopologyStart(b)
    T.TopologyAddMagic(b, magic)
    T.TopologyAddMembersEpoch(b, t.members_epoch)
    T.TopologyAddTopologyEpoch(b, t.topology_epoch)
    T.TopologyAddMembers(b, mv)
    return T.TopologyEnd(b)


def response_bytes(t: topology.Topology, status: int = 0, error: str = "") -> bytes:
    b = flatbuffers.Builder(1024)
    to = build_topology(b, t)
    eo = b.CreateString(error)
    K.MdsResponseStart(b)
    K.MdsResponseAddStatus(b, status)
    K.MdsResponseAddError(b, eo)
    K.MdsResponseAddLeaseTtlMs(b, 2000)
    K.MdsResponseAddTopology(b, to)
    b.Finish(K.MdsResponseEnd(b))
    return bytes(b.Output())


SAMPLE = topology.Topology(
    members_epoch=0x0123456789ABCDEF, topology_epoch=0xFEDCBA9876543210, members=(
        topology.Member("n1", "10.0.0.1:7000", 1, True, "0.2.0", (("engine", "slab"), ("ram", "1GiB")),
                        (topology.Rail("mlx5_0", 4, 5, True), topology.Rail("mlx5_1", 1, 3, False),
                         topology.Rail("mlx5_2", 4, 5, True, 2, 1, 1, 7, topology.HEALTH_QUARANTINED))),
        topology.Member("n2", "10.0.0.2:7000", 3, True, "0.2.0", (), ()),
        topology.Member("drain", "10.0.0.3:7000", 2, False, "", (("note", "ünïcode"),), ()),
    ))


# ---------------------------------------------------------------------------------------
# Decoding


def test_round_trip_through_generated_code():
    status, err, topo = topology.decode_response(response_bytes(SAMPLE, error="none"))
    assert (status, err) == ("Ok", "none")
    assert topo == SAMPLE
    b = flatbuffers.Builder(256)
    b.Finish(build_topology(b, SAMPLE))
    assert topology.decode_topology(bytes(b.Output())) == SAMPLE


def test_ring_and_json_shape():
    j = SAMPLE.to_json("g")
    assert j["members_epoch"] == "0123456789abcdef" and j["topology_epoch"] == "fedcba9876543210"
    shares = {m["id"]: m["share"] for m in j["members"]}
    assert shares["drain"] == 0.0 and shares["n1"] + shares["n2"] == pytest.approx(1.0)
    assert 0.15 < shares["n1"] < 0.35  # weight 1 of 4, within the ring's spread
    assert j["members"][0]["rails"][1] == {"device": "mlx5_1", "port": 0, "port_state": 1, "phys_state": 3,
                                           "query_ok": False, "numa_node": -1, "tier": 0, "generation": 0,
                                           "state": "unqueried"}
    assert j["members"][0]["rails"][2] == {"device": "mlx5_2", "port": 2, "port_state": 4, "phys_state": 5,
                                           "query_ok": True, "numa_node": 1, "tier": 1, "generation": 7,
                                           "state": "quarantined"}
    assert j["members"][0]["rails"][0]["state"] == "up"


def test_rail_state_and_usable():
    R = topology.Rail
    cases = [
        (R("d", 4, 5, True), "up", True),
        (R("d", 1, 3, True), "down", False),
        (R("d", 4, 5, False), "unqueried", False),
        (R("d", 4, 5, True, health=topology.HEALTH_HEALTHY), "healthy", True),
        (R("d", 4, 5, True, health=topology.HEALTH_QUARANTINED), "quarantined", False),
        (R("d", 1, 3, True, health=topology.HEALTH_DOWN), "down", False),
        (R("d", 4, 5, True, health=9), "unknown(RailHealth(9))", False),
    ]
    for rail, state, usable in cases:
        assert (rail.state, rail.usable) == (state, usable), rail


def test_wrong_magic_and_status_are_errors():
    b = flatbuffers.Builder(256)
    b.Finish(build_topology(b, SAMPLE, magic=0x31544C49))
    with pytest.raises(ValueError, match="magic"):
        topology.decode_topology(bytes(b.Output()))
    with pytest.raises(ValueError, match="unknown status"):
        topology.decode_response(response_bytes(SAMPLE, status=200))


def decodes_or_valueerror(buf: bytes):
    try:
        return topology.decode_response(buf)
    except ValueError as e:
        assert str(e)
        return None


def test_truncations_never_decode_differently():
    good = response_bytes(SAMPLE)
    whole = topology.decode_response(good)
    for n in range(len(good)):
        got = decodes_or_valueerror(good[:n])
        # FlatBuffers data grows from the end, so a cut one is broken; it must never look
        # like a shorter, different topology.
        assert got is None or got == whole, n


def test_bit_flips_and_garbage_are_value_errors():
    good = response_bytes(SAMPLE)
    rng = random.Random(14)
    for i in range(len(good)):
        for x in (0xFF, 0x80, 0x01):
            buf = bytearray(good)
            buf[i] ^= x
            decodes_or_valueerror(bytes(buf))
    for _ in range(3000):
        n = rng.choice([0, 1, 4, 7, 8, 12, 16, 31, 64, 200, 1000])
        decodes_or_valueerror(bytes(rng.getrandbits(8) for _ in range(n)))
    # Random bytes behind a plausible root and vtable.
    for _ in range(2000):
        buf = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.getrandbits(8)
        decodes_or_valueerror(bytes(buf))


def test_absurd_counts_fail_fast():
    # A member vector that claims 2^32-1 entries: refused by the limit, not looped over.
    good = bytearray(response_bytes(SAMPLE))
    t = topology._ctl.MdsResponse()
    t.Init(bytes(good), int.from_bytes(good[:4], "little"))
    topo = t.Topology()
    vec = topo._tab.Vector(topo._tab.Offset(10)) - 4  # the length word of Topology.members
    assert int.from_bytes(good[vec:vec + 4], "little") == 3
    good[vec:vec + 4] = (0xFFFFFFFF).to_bytes(4, "little")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="Member count 4294967295 exceeds the limit"):
        topology.decode_response(bytes(good))
    good[vec:vec + 4] = (4000).to_bytes(4, "little")  # under the limit, past the buffer
    with pytest.raises(ValueError, match="outside"):
        topology.decode_response(bytes(good))
    assert time.monotonic() - t0 < 5


def test_verifier_slots_follow_the_schema():
    # _TABLES (what the verifier checks) agrees with schema/*.fbs: field i is slot 4 + 2i.
    sizes = {"ubyte": 1, "bool": 1, "short": 2, "uint": 4, "ulong": 8}
    fields = {}
    for f in (REPO / "schema").glob("*.fbs"):
        for name, base in re.findall(r"^enum (\w+)\s*:\s*(\w+)", f.read_text(), flags=re.M):
            sizes[name] = sizes[base]
        for name, body in re.findall(r"table (\w+) \{(.*?)\}", f.read_text(), flags=re.S):
            decls = re.findall(r"^\s*(\w+)\s*:\s*([\w\[\]]+)", body, flags=re.M)
            fields[name] = {4 + 2 * i: t for i, (_, t) in enumerate(decls)}
    for table, spec in topology._TABLES.items():
        for slot, kind in spec.items():
            t = fields[table][slot]
            if kind == "str":
                assert t == "string", (table, slot)
            elif isinstance(kind, int):
                assert sizes[t] == kind, (table, slot)
            elif kind[0] == "table":
                assert t == kind[1], (table, slot)
            else:
                assert t == f"[{kind[1]}]", (table, slot)
    # Every field of the tables a topology is made of is verified (MdsResponse.clients is not read).
    for table in ("Topology", "Member", "KeyValue", "Rail"):
        assert set(topology._TABLES[table]) == set(fields[table]), table


# ---------------------------------------------------------------------------------------
# Against a real MDS


def register(mds: str, group: str, m: topology.Member) -> None:
    """RegisterMember, built with the generated builders, through the module's own call."""
    b = flatbuffers.Builder(512)
    g = b.CreateString(group)
    mo = build_member(b, m)
    K.MdsRequestStart(b)
    K.MdsRequestAddOp(b, K.MdsOp.RegisterMember)
    K.MdsRequestAddGroup(b, g)
    K.MdsRequestAddMember(b, mo)
    b.Finish(K.MdsRequestEnd(b))
    status, err, _ = topology.decode_response(topology._call(mds, topology.frame(bytes(b.Output())), 5.0))
    assert status == "Ok", err


RAILED = topology.Member("py-rails", "127.0.0.1:1", 3, True, "test", (("engine", "none"), ("transport", "rdma")),
                         (topology.Rail("mlx5_0", 4, 5, True), topology.Rail("mlx5_1", 1, 3, False),
                          topology.Rail("mlx5_2", 1, 3, True, 1, 0, 1, 3, topology.HEALTH_DOWN)))
DRAINED = topology.Member("py-drained", "127.0.0.1:2", 2, False, "test", (), ())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # A long lease: the members this test registers have no heartbeat.
    with run_cluster(tmp_path_factory.mktemp("topology"), lease_ttl="60s") as mds:
        deadline = time.monotonic() + 20
        while not ctl_json("ring", "--mds", mds, "--group", "py")["members"]:
            assert time.monotonic() < deadline, "dfkv_server never registered"
            time.sleep(0.1)
        register(mds, "py", RAILED)
        register(mds, "py", DRAINED)
        yield mds


def ctl_view(mds: str) -> dict:
    """dfkvctl's JSON (the same shape as dfkv.topology's, rails included)."""
    j = ctl_json("ring", "--mds", mds, "--group", "py")
    for m in j["members"]:
        m.setdefault("rails", [])
    return j


def stable_pair(mds: str, py_view) -> tuple:
    """(python view, dfkvctl view) of one topology epoch: retried while a heartbeat moves it."""
    for _ in range(10):
        a, ctl, b = py_view(), ctl_view(mds), py_view()
        if a == b and a["topology_epoch"] == ctl["topology_epoch"]:
            return a, ctl
    pytest.fail("the topology kept changing between reads")


def assert_same(py: dict, ctl: dict) -> None:
    assert [m["id"] for m in py["members"]] == [m["id"] for m in ctl["members"]]
    for p, c in zip(py["members"], ctl["members"]):
        assert p.pop("share") == pytest.approx(c.pop("share"), abs=1e-9), p["id"]
    assert py == ctl


def test_fetch_equals_dfkvctl(cluster):
    py, ctl = stable_pair(cluster, lambda: topology.fetch(cluster, "py").to_json("py"))
    assert_same(py, ctl)
    ids = {m["id"]: m for m in py["members"]}
    assert set(ids) == {"py-n1", "py-rails", "py-drained"}
    # What this test registered (its own values, not the decoder's) came back through Go.
    t = topology.fetch(cluster, "py")
    got = {m.id: m for m in t.members}
    assert got["py-rails"] == RAILED and got["py-drained"] == DRAINED
    assert got["py-n1"].eligible and got["py-n1"].weight == 1 and got["py-n1"].address.startswith("127.0.0.1:")
    assert t.members_epoch and t.topology_epoch


def test_cli_json_equals_dfkvctl(cluster):
    def cli():
        out = subprocess.run([sys.executable, "-m", "dfkv.topology", "--mds", cluster, "--group", "py", "--json"],
                             cwd=PYTHON_DIR, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert_same(*stable_pair(cluster, cli))
    out = subprocess.run([sys.executable, "-m", "dfkv.topology", "--mds", cluster, "--group", "py"],
                         cwd=PYTHON_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("group py: 3 members") and "mlx5_0:4/5:up,mlx5_1:1/3:unqueried,mlx5_2:1/3:down" in out.stdout


def test_empty_group_and_failover(cluster):
    # An unknown group is an empty topology; a dead first replica is skipped.
    assert topology.fetch(cluster, "nobody-here").members == ()
    dead = f"127.0.0.1:{free_port()}"
    assert {m.id for m in topology.fetch([dead, cluster], "py").members} == {"py-n1", "py-rails", "py-drained"}


def test_cli_errors_are_clear(server):
    dead = f"127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "dfkv.topology", "--mds", dead, "--timeout", "2"],
                         cwd=PYTHON_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no MDS replica answered" in out.stderr and dead in out.stderr
    # A cache node's data port is not an MDS: refused by the node, said so, no hang.
    out = subprocess.run([sys.executable, "-m", "dfkv.topology", "--mds", server, "--timeout", "5"],
                         cwd=PYTHON_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "MDS" in out.stderr, out.stderr


def test_silent_peer_times_out():
    # A listener that never answers: the call ends at its deadline.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(topology.MdsError, match="timed out"):
            topology.fetch(addr, timeout=0.5)
        assert time.monotonic() - t0 < 10
