"""dfkv_client_options_v2's LP64 layout and the Python-side option building (no library
needed). test_abi.py checks the generated declarations against dfkv.h with the C compiler."""

from __future__ import annotations

import ctypes

import pytest

from dfkv import DfkvError
from dfkv._lib import CLIENT_OPT_REGISTER_WITH_MDS, ClientOptionsV2
from dfkv.client import build_options
from dfkv.identity import Namespace

FIELDS = [f for f, _ in ClientOptionsV2._fields_]


def test_struct_size_and_offsets():
    assert ctypes.sizeof(ClientOptionsV2) == 88
    want = [0, 4, 8, 16, 24, 32, 40, 48, 56, 60, 64, 72, 80, 84]
    assert [getattr(ClientOptionsV2, f).offset for f in FIELDS] == want


def test_defaults():
    o, _ = build_options("n1=127.0.0.1:1")
    assert o.struct_size == 88 and o.abi_version == 2 and o.reserved0 == 0
    assert o.members == b"n1=127.0.0.1:1"
    assert not o.key_namespace and o.key_namespace_len == 0
    assert o.mds_endpoints is None and o.mds_group is None and o.client_id is None
    assert o.flags == 0 and o.batch_concurrency == 0 and o.mds_poll_ms == 0


def test_namespace_is_copied_with_nul():
    # `keep` owns the namespace copy the struct points into; it must outlive the reads.
    o, keep = build_options("n1=h:1", b"a\x00b")
    assert o.key_namespace_len == 3
    assert ctypes.string_at(o.key_namespace, 3) == b"a\x00b"
    ns = Namespace(model="m", layout="l", dtype="d", page_tokens=1)
    o, keep = build_options("n1=h:1", ns)
    assert ctypes.string_at(o.key_namespace, o.key_namespace_len) == ns.encode()
    o, keep = build_options("n1=h:1", bytearray(b"xy"))
    assert ctypes.string_at(o.key_namespace, 2) == b"xy"


@pytest.mark.parametrize("members,want", [
    ({"n1": "h:1", "n2": ("h:2", 3)}, b"n1=h:1,n2=h:2@3"),
    (["n1=h:1", ("n2", "h:2")], b"n1=h:1,n2=h:2"),
    ([("n1", "h:1", 2)], b"n1=h:1@2"),
])
def test_member_forms(members, want):
    assert build_options(members)[0].members == want


def test_mds_and_registration():
    o, _ = build_options(mds_endpoints=["a:1", "b:2"], mds_group="g", mds_poll_ms=500,
                         client_id="me", client_info={"engine": "sglang", "rank": 3},
                         client_heartbeat_ms=1000, batch_concurrency=8)
    assert o.mds_endpoints == b"a:1,b:2" and o.mds_group == b"g" and o.mds_poll_ms == 500
    assert o.flags == CLIENT_OPT_REGISTER_WITH_MDS  # auto: MDS discovery registers
    assert o.client_id == b"me" and o.client_info == b"engine=sglang,rank=3"
    assert o.client_heartbeat_ms == 1000 and o.batch_concurrency == 8
    assert build_options(mds_endpoints="a:1", register_with_mds=False)[0].flags == 0
    assert build_options("n1=h:1", register_with_mds=True)[0].flags == CLIENT_OPT_REGISTER_WITH_MDS
    assert build_options("n1=h:1", client_info="k=v")[0].client_info == b"k=v"


def test_register_env_opt_out(monkeypatch):
    monkeypatch.setenv("DFKV_CLIENT_REGISTER", "0")
    assert build_options(mds_endpoints="a:1")[0].flags == 0
    assert build_options(mds_endpoints="a:1", register_with_mds=True)[0].flags == CLIENT_OPT_REGISTER_WITH_MDS


@pytest.mark.parametrize("kw", [
    dict(members="n1=h:1\x00"),
    dict(members=[42]),
    dict(namespace="text"),
    dict(namespace=12),
    dict(client_info={"a,b": "c"}),
    dict(client_info={"a": "b,c"}),
    dict(client_info=["k=v"]),
    dict(mds_poll_ms=1 << 31),
    dict(batch_concurrency=-1),
    dict(client_heartbeat_ms="5"),
    dict(client_id=b"id"),
])
def test_bad_options_raise(kw):
    kw.setdefault("members", "n1=h:1")
    with pytest.raises(DfkvError):
        build_options(**kw)
