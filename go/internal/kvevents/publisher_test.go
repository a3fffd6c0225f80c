package kvevents

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dfkv/dfkv/go/internal/wire"
)

func newTestPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	cfg.Endpoint = "tcp://127.0.0.1:0"
	cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func subscribe(t *testing.T, addr string) zmq4.Socket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close() })
	if err := sub.Dial(addr); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	return sub
}

// frame is one received batch: topic, sequence, and the events' type names.
type frame struct {
	topic string
	seq   uint64
	kinds []string
}

func decodeFrame(t *testing.T, f [][]byte) frame {
	t.Helper()
	if len(f) != 3 || len(f[1]) != 8 {
		t.Fatalf("frame of %d parts", len(f))
	}
	var batch []any
	if err := msgpack.Unmarshal(f[2], &batch); err != nil {
		t.Fatal(err)
	}
	out := frame{topic: string(f[0]), seq: binary.BigEndian.Uint64(f[1])}
	for _, ev := range batch[1].([]any) {
		out.kinds = append(out.kinds, ev.([]any)[0].(string))
	}
	return out
}

func recvFrame(t *testing.T, s zmq4.Socket) frame {
	t.Helper()
	msg, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return decodeFrame(t, msg.Frames)
}

func TestPublishAndReplay(t *testing.T) {
	p := newTestPublisher(t, Config{Topic: "kv@{node}@{model}", Node: "n1"})
	sub := subscribe(t, p.Addr())
	time.Sleep(200 * time.Millisecond) // the subscription reaches the publisher
	p.Start("")
	tag := &wire.ObjectTag{Model: "m", BlockHashes: []wire.BlockHash{{Int: 1}}}
	p.Stored(tag)
	f := recvFrame(t, sub)
	if f.topic != "kv@n1@m" || f.seq != 0 || len(f.kinds) != 1 || f.kinds[0] != "BlockStored" {
		t.Fatalf("first frame %+v", f)
	}
	p.Removed(tag)
	p.Cleared() // another topic: its own batch
	got := []frame{recvFrame(t, sub), recvFrame(t, sub)}
	if got[0].kinds[0] != "BlockRemoved" || got[1].topic != "kv@n1@" || got[1].kinds[0] != "AllBlocksCleared" || got[1].seq != 2 {
		t.Fatalf("frames %+v", got)
	}

	// A late subscriber asks the replay socket for everything from seq 1.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(p.ReplayAddr()); err != nil {
		t.Fatal(err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], 1)
	if err := d.Send(zmq4.NewMsgFrom(nil, start[:])); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 {
			t.Fatalf("replay reply of %d frames", len(msg.Frames))
		}
		s := int64(binary.BigEndian.Uint64(msg.Frames[1]))
		if s == -1 {
			break
		}
		seqs = append(seqs, s)
	}
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("replayed %v, want [1 2]", seqs)
	}
}

// A full queue drops (counted) instead of blocking, and the drop shows as a gap.
func TestFullQueueDropsAndGaps(t *testing.T) {
	p := newTestPublisher(t, Config{QueueLen: 4})
	sub := subscribe(t, p.Addr())
	time.Sleep(200 * time.Millisecond)
	tag := &wire.ObjectTag{BlockHashes: []wire.BlockHash{{Int: 1}}}
	start := time.Now()
	for range 10 {
		p.Stored(tag) // not started: the queue takes 4
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("publishing into a full queue took %v", d)
	}
	if p.Dropped() != 6 {
		t.Fatalf("dropped %d, want 6", p.Dropped())
	}
	p.Start("n")
	f := recvFrame(t, sub)
	if f.seq != 1 || len(f.kinds) != 4 {
		t.Fatalf("after drops got %+v, want seq 1 (a gap at 0) with 4 events", f)
	}
}
