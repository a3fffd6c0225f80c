"""KV events end to end: a real dfkv_server with --kv-events, the real libdfkv.so storing
tagged blocks through the Python binding, and vLLM's own event classes
(``vllm.distributed.kv_events``, decoded with msgspec as vLLM's subscribers do) reading
every message that arrives over pyzmq: BlockStored after tagged puts, BlockRemoved after a
remove, an overwrite and capacity eviction, replay for a late subscriber, nothing on a
restart with the data intact and AllBlocksCleared on a restart with a wiped directory.

The layout the installed vLLM declares (vLLM 0.33: a positional batch of tagged-map events)
is checked against vLLM's classes as they are; the other layouts dfkv can publish (every
struct positional, as older vLLM; the batch a map too) against the same classes rebuilt with
those msgspec array_like settings (their fields, types and defaults unchanged).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from conftest import LIB_PATH, SERVER_BIN, missing_build

kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vllm is not installed")
msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

VALUE = 256 << 10  # one engine block's bytes
CAP = 16 << 20


# layout -> (EventBatch array_like, event structs array_like)
LAYOUTS = {"array": (True, True), "map": (True, False), "map-all": (False, False)}


def _vllm_shape() -> Tuple[bool, bool]:
    return (kv_events.KVEventBatch.__struct_config__.array_like,
            kv_events.BlockStored.__struct_config__.array_like)


def _decoder(layout: str):
    """msgspec decoder for KVEventBatch in the given layout, from vLLM's own classes: as
    they are when the installed vLLM speaks that layout, else rebuilt with the layout's
    array_like settings (fields, types and defaults unchanged)."""
    if LAYOUTS[layout] == _vllm_shape():
        return msgspec.msgpack.Decoder(type=kv_events.KVEventBatch), (
            kv_events.BlockStored, kv_events.BlockRemoved, kv_events.AllBlocksCleared)
    batch_array, event_array = LAYOUTS[layout]

    def rebuild(cls, array_like, **kw):
        fields = []
        for f in msgspec.structs.fields(cls):
            # Older, array_like vLLM's BlockStored ended at medium: dfkv's array layout
            # leaves a nil lora_name out (llm-d decodes that exact length).
            if f.required and not (array_like and f.name == "lora_name"):
                fields.append((f.name, f.type))
            else:
                fields.append((f.name, f.type, None if f.required else f.default))
        return msgspec.defstruct(cls.__name__, fields, array_like=array_like, omit_defaults=True, **kw)

    stored = rebuild(kv_events.BlockStored, event_array, tag=True)
    removed = rebuild(kv_events.BlockRemoved, event_array, tag=True)
    cleared = rebuild(kv_events.AllBlocksCleared, event_array, tag=True)
    fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default)
              for f in msgspec.structs.fields(kv_events.KVEventBatch) if f.name != "events"]
    fields.insert(1, ("events", List[stored | removed | cleared]))
    batch = msgspec.defstruct("KVEventBatch", fields, array_like=batch_array, omit_defaults=True)
    return msgspec.msgpack.Decoder(type=batch), (stored, removed, cleared)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A dfkv_server with KV events on, restartable over the same directory."""

    def __init__(self, tmp: Path, layout: str):
        self.tmp, self.layout = tmp, layout
        self.data = tmp / "data"
        self.pub = f"tcp://127.0.0.1:{_free_port()}"
        self.replay = f"tcp://127.0.0.1:{_free_port()}"
        self.proc = None
        self.addr = ""
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        addr_file = self.tmp / f"addr{self.runs}"
        self.log_path = self.tmp / f"server{self.runs}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(addr_file),
             "--dir", str(self.data), "--cap", str(CAP), "--max-msg", str(1 << 20),
             "--kv-events", self.pub, "--kv-events-replay", self.replay,
             "--kv-events-layout", self.layout, "--kv-events-topic", "kv@{node}@{model}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.proc.poll() is None:
            if addr_file.is_file() and addr_file.read_text().strip():
                self.addr = addr_file.read_text().strip()
                return
            time.sleep(0.02)
        raise AssertionError("dfkv_server did not start:\n" + self.log_path.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        self.proc = None


class Subscriber:
    """A pyzmq SUB on the node's stream; every message is decoded with vLLM's classes."""

    def __init__(self, ctx, node: Node, decoder):
        self.node, self.decoder = node, decoder
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(node.pub)
        self.last_seq = None
        self.topics = set()

    def recv(self, timeout: float) -> List[Tuple[int, Any]]:
        """Every batch that arrives within timeout, as (seq, decoded batch)."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sub.poll(int(left * 1000)):
                return out
            topic, seq, payload = self.sub.recv_multipart()
            self.topics.add(topic.decode())
            out.append((int.from_bytes(seq, "big"), self.decoder.decode(payload)))

    def wait_for(self, pred, timeout: float = 15) -> List[Any]:
        """Events until pred(all events so far) holds."""
        events: List[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, batch in self.recv(0.2):
                events.extend(batch.events)
            if pred(events):
                return events
        raise AssertionError(f"condition not met in {timeout}s; events: {events!r}")

    def close(self) -> None:
        self.sub.close(linger=0)


def replay(ctx, node: Node, decoder, start: int = 0) -> List[Tuple[int, Any]]:
    """Ask the node's ROUTER for every buffered batch from start (vLLM's replay protocol)."""
    d = ctx.socket(zmq.DEALER)
    d.connect(node.replay)
    try:
        d.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert d.poll(10000), "replay did not answer in 10 s"
            frames = d.recv_multipart()
            assert len(frames) == 3 and frames[0] == b"", frames
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                return out
            out.append((seq, decoder.decode(frames[2])))
    finally:
        d.close(linger=0)


def hashes_of(events, cls) -> set:
    return {h for e in events if isinstance(e, cls) for h in e.block_hashes}


def block_hash(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8  # 32 bytes, like vLLM's sha256 block hashes


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_kv_events_lifecycle(tmp_path, layout):
    why = missing_build()
    if why:
        pytest.skip(why)
    os.environ.setdefault("DFKV_LIB", str(LIB_PATH))
    import dfkv

    decoder, (Stored, Removed, Cleared) = _decoder(layout)
    node = Node(tmp_path, layout)
    ctx = zmq.Context()
    node.start()
    try:
        # A late subscriber: the fresh node's AllBlocksCleared went out before anyone
        # listened; replay has it once the publisher has sent its first batch (batches go
        # out on an interval, so a replay right after start may find the buffer empty).
        deadline = time.monotonic() + 10
        got = replay(ctx, node, decoder)
        while not got and time.monotonic() < deadline:
            time.sleep(0.1)
            got = replay(ctx, node, decoder)
        assert [type(e) for _, b in got for e in b.events] == [Cleared], got
        sub = Subscriber(ctx, node, decoder)
        time.sleep(0.5)  # the subscription reaches the publisher

        ns = b"kv-events\x00" + uuid.uuid4().bytes
        c = dfkv.Client(f"n1={node.addr}", namespace=ns)
        keys = [f"block-{i}".encode() for i in range(8)]
        ok = c.batch_put(keys, [bytes([i]) * VALUE for i in range(8)])
        assert all(ok)
        tags = [dfkv.Tag(key=k, block_hashes=[block_hash(i)], parent=block_hash(i - 1) if i else None,
                         token_ids=list(range(i * 16, i * 16 + 16)), block_size=16, model="test-model")
                for i, k in enumerate(keys)]
        tags.append(dfkv.Tag(key=b"never-stored", block_hashes=[block_hash(99)], model="test-model"))
        assert c.tag(tags) == 8, c.last_error()
        events = sub.wait_for(lambda ev: hashes_of(ev, Stored) == {block_hash(i) for i in range(8)})
        first = next(e for e in events if isinstance(e, Stored) and e.block_hashes == [block_hash(1)])
        assert first.parent_block_hash == block_hash(0)
        assert first.token_ids == list(range(16, 32)) and first.block_size == 16
        assert first.medium == "CPU" and first.lora_id is None
        assert sub.topics == {f"kv@{node.addr}@test-model"}

        # Remove and overwrite (an untagged put over a tagged block) publish BlockRemoved.
        assert c.remove(keys[0])
        assert c.put(keys[1], b"x" * VALUE)
        sub.wait_for(lambda ev: hashes_of(ev, Removed) == {block_hash(0), block_hash(1)})

        # Capacity eviction: untagged values several times the cap push the rest out.
        for j in range(0, 3 * CAP // VALUE, 8):
            c.batch_put([f"filler-{j + k}".encode() for k in range(8)], [b"f" * VALUE] * 8)
        sub.wait_for(lambda ev: hashes_of(ev, Removed) >= {block_hash(i) for i in range(2, 8)}, timeout=30)

        # Late subscriber: replay from 0 holds every batch of this run, in order.
        got = replay(ctx, node, decoder)
        seqs = [s for s, _ in got]
        assert seqs == sorted(seqs) and seqs[0] == 0
        replayed = [e for _, b in got for e in b.events]
        assert hashes_of(replayed, Stored) == {block_hash(i) for i in range(8)}

        # Tag three blocks that stay, then restart with the data intact: nothing spurious.
        keep = [f"keep-{i}".encode() for i in range(3)]
        assert all(c.batch_put(keep, [b"k" * VALUE] * 3))
        # int hashes as vLLM publishes them with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (uint64)
        big = [(1 << 64) - 1 - i for i in range(3)]
        assert c.tag([dfkv.Tag(key=k, block_hashes=[big[i]], model="test-model")
                      for i, k in enumerate(keep)]) == 3
        sub.wait_for(lambda ev: hashes_of(ev, Stored) == set(big))
        c.close()
        sub.close()
        node.stop()
        node.start()
        sub = Subscriber(ctx, node, decoder)
        assert sub.recv(1.5) == []
        assert replay(ctx, node, decoder) == []
        c = dfkv.Client(f"n1={node.addr}", namespace=ns)
        assert c.get(keep[0], VALUE) == b"k" * VALUE
        # The tags survived the restart: removing a kept block still names its hash.
        assert c.remove(keep[0])
        sub.wait_for(lambda ev: hashes_of(ev, Removed) == {big[0]})
        c.close()
        sub.close()

        # Restart after the disk lost its data: AllBlocksCleared.
        node.stop()
        shutil.rmtree(node.data)
        node.start()
        got = replay(ctx, node, decoder)
        assert [type(e) for _, b in got for e in b.events] == [Cleared], got
    finally:
        node.stop()
        ctx.destroy(linger=0)  # closes any socket a failed assertion left open
