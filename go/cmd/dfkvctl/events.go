package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// runEvents prints the KV events of every node of a group (their kv_events endpoints from
// the MDS topology) or of the given endpoints, one line per event, and the gaps in each
// node's sequence (docs/EVENTS.md).
func runEvents(argv []string, g clusterFlags, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkvctl events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.mds, "mds", g.mds, "MDS replicas host:port[,...]: follow every node of --group")
	fs.StringVar(&g.group, "group", g.group, "MDS group")
	endpoints := fs.String("endpoint", "", "instead of --mds: KV-event PUB endpoints tcp://host:port[,...]")
	duration := fs.Duration("duration", 0, "stop after this long (0 = until interrupted)")
	if err := fs.Parse(argv); err != nil {
		return exitError
	}
	if err := cli.ApplyEnv(fs); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	if err := sec.load(); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	type src struct{ name, ep string }
	var srcs []src
	if *endpoints != "" {
		for _, ep := range strings.Split(*endpoints, ",") {
			srcs = append(srcs, src{strings.TrimPrefix(ep, "tcp://"), strings.TrimSpace(ep)})
		}
	} else {
		eps, err := mdsclient.ParseEndpoints(g.mds)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl: events needs --mds or --endpoint:", err)
			return exitError
		}
		rpc, err := mdsclient.New(eps, mdsclient.Options{CallTimeout: g.timeout, TLS: sec.cfg, Token: sec.token})
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout*time.Duration(len(eps)+1))
		resp, _, err := rpc.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: g.group})
		cancel()
		rpc.Close()
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		for _, m := range resp.Topology.Members {
			for _, kv := range m.Config {
				if kv.Key == wire.MemberKVEventsKey {
					srcs = append(srcs, src{m.ID, kv.Value})
				}
			}
		}
	}
	if len(srcs) == 0 {
		fmt.Fprintln(stderr, "dfkvctl: no node publishes KV events (start dfkv_server with --kv-events)")
		return exitError
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	var mu sync.Mutex // one line at a time
	var wg sync.WaitGroup
	for _, s := range srcs {
		sub := zmq4.NewSub(ctx)
		if err := sub.Dial(s.ep); err != nil {
			fmt.Fprintf(stderr, "dfkvctl: %s (%s): %v\n", s.name, s.ep, err)
			continue
		}
		_ = sub.SetOption(zmq4.OptionSubscribe, "")
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sub.Close()
			var last int64 = -1
			for {
				msg, err := sub.Recv()
				if err != nil {
					return
				}
				lines, seq := formatFrames(s.name, msg.Frames, last)
				last = seq
				mu.Lock()
				for _, l := range lines {
					fmt.Fprintln(stdout, l)
				}
				mu.Unlock()
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	return exitOK
}

// formatFrames renders one [topic, seq, payload] message of node, given the previous
// sequence number (-1: none yet), and returns the lines and this message's sequence.
func formatFrames(node string, f [][]byte, last int64) ([]string, int64) {
	if len(f) != 3 || len(f[1]) != 8 {
		return []string{fmt.Sprintf("%s\tmalformed message of %d frames", node, len(f))}, last
	}
	seq := int64(binary.BigEndian.Uint64(f[1]))
	var lines []string
	if last >= 0 && seq != last+1 {
		lines = append(lines, fmt.Sprintf("%s\tGAP\tmissed seq %d..%d (dropped or lost: resync)", node, last+1, seq-1))
	}
	var batch any
	if err := msgpack.Unmarshal(f[2], &batch); err != nil {
		return append(lines, fmt.Sprintf("%s\tseq=%d\tundecodable payload: %v", node, seq, err)), seq
	}
	var events []any
	switch b := batch.(type) {
	case []any:
		if len(b) > 1 {
			events, _ = b[1].([]any)
		}
	case map[string]any:
		events, _ = b["events"].([]any)
	}
	for _, ev := range events {
		kind, fields := eventFields(ev)
		l := fmt.Sprintf("%s\tseq=%d\t%s", node, seq, kind)
		if h, ok := fields["block_hashes"].([]any); ok {
			l += "\thashes=" + hashList(h)
		}
		if m, ok := fields["medium"].(string); ok {
			l += "\tmedium=" + m
		}
		lines = append(lines, l+"\ttopic="+string(f[0]))
	}
	return lines, seq
}

// eventFields names an event's fields in either layout (positional or tagged map).
func eventFields(ev any) (string, map[string]any) {
	switch e := ev.(type) {
	case map[string]any:
		k, _ := e["type"].(string)
		return k, e
	case []any:
		if len(e) == 0 {
			return "?", nil
		}
		k, _ := e[0].(string)
		names := map[string][]string{
			"BlockStored":  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
			"BlockRemoved": {"block_hashes", "medium"},
		}[k]
		m := map[string]any{}
		for i, n := range names {
			if i+1 < len(e) {
				m[n] = e[i+1]
			}
		}
		return k, m
	}
	return "?", nil
}

func hashList(hs []any) string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		if b, ok := h.([]byte); ok {
			out = append(out, hex.EncodeToString(b))
		} else {
			out = append(out, fmt.Sprint(h))
		}
	}
	return strings.Join(out, ",")
}
