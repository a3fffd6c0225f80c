package llmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// What llm-d's indexer expects, as its source reads: its SUB binds with the filter "kv@" and
// engines connect to it; a message is exactly [topic, 8-byte big-endian seq, payload]; the
// topic splits on "@" into kv, pod and model; the payload is an array of at least [ts, events]
// (a third element is the DP rank); every event is an array whose first element is its type
// name, BlockStored [type, hashes, parent or nil, []uint32 token ids, int block size, lora id
// or nil, medium] and BlockRemoved [type, hashes, medium], of exactly that length
// (vmihailenco/msgpack refuses an array-encoded struct of another length: the array layout
// ends at medium, as older vLLM's did, unless a LoRA name is set); older releases want uint64
// hashes. A map, bytes where a uint64 is wanted, or another length is an error.
type stored struct {
	_         struct{} `msgpack:",array"`
	Type      string
	Hashes    []uint64
	Parent    *uint64
	TokenIDs  []uint32
	BlockSize int
	LoraID    *int
	Medium    *string
}

type removed struct {
	_      struct{} `msgpack:",array"`
	Type   string
	Hashes []uint64
	Medium *string
}

// Index is the indexer's view: model -> block hash -> pods holding it.
type Index map[string]map[uint64]map[string]bool

// Has reports whether pod holds block h of model.
func (ix Index) Has(model string, h uint64, pod string) bool { return ix[model][h][pod] }

// Digest applies one message's events, or says why llm-d would refuse it.
func (ix Index) Digest(f [][]byte) error {
	if len(f) != 3 || len(f[1]) != 8 {
		return fmt.Errorf("message of %d frames (want topic, 8-byte seq, payload)", len(f))
	}
	parts := strings.Split(string(f[0]), "@")
	if len(parts) != 3 || parts[0] != "kv" {
		return fmt.Errorf("topic %q: not kv@<pod>@<model>", f[0])
	}
	pod, model := parts[1], parts[2]
	d := msgpack.NewDecoder(bytes.NewReader(f[2]))
	n, err := d.DecodeArrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch: array of %d, want [ts, events, ...]", n)
	}
	if _, err := d.DecodeFloat64(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	var events []msgpack.RawMessage
	if err := d.Decode(&events); err != nil {
		return fmt.Errorf("batch events: %w", err)
	}
	for _, raw := range events {
		var head []msgpack.RawMessage
		if err := msgpack.Unmarshal(raw, &head); err != nil {
			return fmt.Errorf("event not an array_like tagged union: %w", err)
		}
		if len(head) == 0 {
			return fmt.Errorf("event: empty array, want an array_like tagged union")
		}
		var kind string
		if err := msgpack.Unmarshal(head[0], &kind); err != nil {
			return fmt.Errorf("event type: %w", err)
		}
		switch kind {
		case "BlockStored":
			var ev stored
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("BlockStored: %w", err)
			}
			for _, h := range ev.Hashes {
				if ix[model] == nil {
					ix[model] = map[uint64]map[string]bool{}
				}
				if ix[model][h] == nil {
					ix[model][h] = map[string]bool{}
				}
				ix[model][h][pod] = true
			}
		case "BlockRemoved":
			var ev removed
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("BlockRemoved: %w", err)
			}
			for _, h := range ev.Hashes {
				delete(ix[model][h], pod)
			}
		case "AllBlocksCleared": // llm-d's pool decodes it and does nothing with it
		default:
			return fmt.Errorf("unknown event type %q", kind)
		}
	}
	return nil
}

// Sub is a bound SUB socket whose messages arrive on a channel.
type Sub struct {
	sock zmq4.Socket
	msgs chan [][]byte
}

// Listen binds a SUB on addr (tcp://127.0.0.1:0) subscribed to "kv@", as llm-d's indexer.
func Listen(ctx context.Context, addr string) (*Sub, error) {
	sock := zmq4.NewSub(ctx)
	if err := sock.Listen(addr); err != nil {
		sock.Close()
		return nil, fmt.Errorf("llmd: listen %s: %w", addr, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		sock.Close()
		return nil, fmt.Errorf("llmd: subscribe: %w", err)
	}
	s := &Sub{sock: sock, msgs: make(chan [][]byte, 1024)}
	go func() {
		defer close(s.msgs)
		for {
			msg, err := sock.Recv()
			if err != nil {
				return
			}
			s.msgs <- msg.Frames
		}
	}()
	return s, nil
}

// Endpoint is what a publisher dials: tcp://HOST:PORT of the bound socket.
func (s *Sub) Endpoint() string { return "tcp://" + s.sock.Addr().String() }

// ErrClosed: the socket ended.
var ErrClosed = errors.New("llmd: subscriber closed")

// Next returns the next message, nil when none came within wait.
func (s *Sub) Next(wait time.Duration) ([][]byte, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case f, ok := <-s.msgs:
		if !ok {
			return nil, ErrClosed
		}
		return f, nil
	case <-t.C:
		return nil, nil
	}
}

// Close ends the socket.
func (s *Sub) Close() error { return s.sock.Close() }
