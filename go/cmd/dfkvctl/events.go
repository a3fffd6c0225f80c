package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sort"
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
// the MDS topology, re-read every --refresh so that nodes that join, leave or move are
// followed) or of the given endpoints, one line per event, and the gaps and restarts in each
// node's sequence (docs/EVENTS.md).
func runEvents(argv []string, g clusterFlags, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkvctl events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.mds, "mds", g.mds, "MDS replicas host:port[,...]: follow every node of --group")
	fs.StringVar(&g.group, "group", g.group, "MDS group")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "deadline per MDS request")
	endpoints := fs.String("endpoint", "", "instead of --mds: KV-event PUB endpoints tcp://host:port[,...]")
	duration := fs.Duration("duration", 0, "stop after this long (0 = until interrupted)")
	refresh := fs.Duration("refresh", 2*time.Second, "with --mds: re-read the topology this often (nodes joining, leaving, moving)")
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
	if *refresh <= 0 {
		fmt.Fprintln(stderr, "dfkvctl: --refresh must be positive")
		return exitError
	}
	var discover func() (map[string]string, error)
	if *endpoints != "" {
		static := map[string]string{}
		for _, ep := range strings.Split(*endpoints, ",") {
			ep = strings.TrimSpace(ep)
			static[strings.TrimPrefix(ep, "tcp://")] = ep
		}
		discover = func() (map[string]string, error) { return static, nil }
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
		defer rpc.Close()
		discover = func() (map[string]string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), g.timeout*time.Duration(len(eps)+1))
			defer cancel()
			return topologyStreams(ctx, rpc, g.group)
		}
	}
	srcs, err := discover()
	if err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	if len(srcs) == 0 && *endpoints != "" {
		fmt.Fprintln(stderr, "dfkvctl: no endpoint given")
		return exitError
	}
	if len(srcs) == 0 {
		fmt.Fprintln(stderr, "dfkvctl: no node publishes KV events yet (dfkv_server --kv-events); waiting for one")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	f := &followers{ctx: ctx, out: stdout, running: map[string]*follower{}}
	defer f.stopAll()
	tick := time.NewTicker(*refresh)
	defer tick.Stop()
	for {
		f.sync(srcs)
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
		if *endpoints != "" {
			continue
		}
		if next, err := discover(); err != nil {
			f.println(fmt.Sprintf("-\tMDS\ttopology not read (%v): following the last known nodes", err))
		} else {
			srcs = next
		}
	}
}

// topologyStreams lists group's members that publish KV events: node id -> endpoint.
func topologyStreams(ctx context.Context, rpc *mdsclient.Client, group string) (map[string]string, error) {
	resp, _, err := rpc.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: group})
	if err != nil {
		return nil, fmt.Errorf("list topology: %w", err)
	}
	out := map[string]string{}
	for _, m := range resp.Topology.Members {
		for _, kv := range m.Config {
			if kv.Key == wire.MemberKVEventsKey {
				out[m.ID] = kv.Value
			}
		}
	}
	return out, nil
}

// followers keeps one subscriber per node in step with the discovered streams.
type followers struct {
	ctx     context.Context
	out     io.Writer
	mu      sync.Mutex // one line at a time
	running map[string]*follower
	wg      sync.WaitGroup
}

type follower struct {
	ep     string
	sub    zmq4.Socket
	cancel context.CancelFunc
}

func (f *followers) println(lines ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range lines {
		fmt.Fprintln(f.out, l)
	}
}

// sync starts followers for new nodes (or moved endpoints), stops those of nodes that left,
// and re-sends every subscription: go-zeromq reconnects to a restarted node without
// replaying it, and a PUB sends nothing to a peer that never subscribed.
func (f *followers) sync(srcs map[string]string) {
	for name, fl := range f.running {
		if ep, ok := srcs[name]; !ok || ep != fl.ep {
			fl.cancel()
			delete(f.running, name)
			f.println(fmt.Sprintf("%s\tLEFT\t%s", name, fl.ep))
		} else {
			_ = fl.sub.SetOption(zmq4.OptionSubscribe, "")
		}
	}
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, ok := f.running[name]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(f.ctx)
		// Dial retries until the node answers or it is no longer followed; a dropped
		// connection is redialled the same way.
		sub := zmq4.NewSub(ctx, zmq4.WithAutomaticReconnect(true), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithLogger(log.New(io.Discard, "", 0)))
		fl := &follower{ep: srcs[name], sub: sub, cancel: cancel}
		f.running[name] = fl
		f.wg.Add(1)
		go f.follow(ctx, name, fl)
	}
}

func (f *followers) follow(ctx context.Context, name string, fl *follower) {
	defer f.wg.Done()
	defer fl.sub.Close()
	if err := fl.sub.Dial(fl.ep); err != nil {
		if ctx.Err() == nil {
			f.println(fmt.Sprintf("%s\tERROR\t%s: %v", name, fl.ep, err))
		}
		return
	}
	_ = fl.sub.SetOption(zmq4.OptionSubscribe, "")
	f.println(fmt.Sprintf("%s\tFOLLOW\t%s", name, fl.ep))
	var last int64 = -1
	for {
		msg, err := fl.sub.Recv()
		if err != nil || ctx.Err() != nil {
			return
		}
		lines, seq := formatFrames(name, msg.Frames, last)
		last = seq
		f.println(lines...)
	}
}

func (f *followers) stopAll() {
	for _, fl := range f.running {
		fl.cancel()
	}
	f.wg.Wait()
}

// formatFrames renders one [topic, seq, payload] message of node, given the previous
// sequence number (-1: none yet), and returns the lines and this message's sequence.
func formatFrames(node string, f [][]byte, last int64) ([]string, int64) {
	if len(f) != 3 || len(f[1]) != 8 {
		return []string{fmt.Sprintf("%s\tmalformed message of %d frames", node, len(f))}, last
	}
	seq := int64(binary.BigEndian.Uint64(f[1]))
	var lines []string
	switch {
	case last >= 0 && seq <= last:
		lines = append(lines, fmt.Sprintf("%s\tRESTART\tsequence %d after %d (the node restarted: resync)", node, seq, last))
	case last >= 0 && seq != last+1:
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
