package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// Defaults that vLLM's subscriber and llm-d's indexer accept: llm-d parses topics of the
// form kv@<pod>@<model> (a "" subscription, vLLM's default, matches every topic), and
// scores the "cpu" tier below "gpu".
const (
	DefaultTopic    = "kv@{node}@{model}"
	DefaultMedium   = "CPU"
	DefaultQueue    = 65536
	DefaultBuffer   = 10000
	DefaultMaxBatch = 256
	DefaultFlush    = 5 * time.Millisecond
)

// Config configures a Publisher.
type Config struct {
	Endpoint       string // PUB, e.g. tcp://127.0.0.1:5557 (port 0 picks one)
	ReplayEndpoint string // ROUTER for replay requests; "" = none
	// Connect lists subscribers that bind, which the publisher dials (llm-d's indexer
	// binds its SUB, tcp://*:5557, and engines connect to it); redialled when they restart.
	Connect []string
	// Topic is the ZMQ topic of every batch; {node} and {model} are replaced by Node and
	// the tag's model label (batches are split by topic).
	Topic  string
	Node   string
	Medium string // the tier named in every event's medium field ("" = nil)
	Layout Layout
	Rank   int // data_parallel_rank of every batch

	QueueLen  int           // events waiting for the publisher goroutine (DefaultQueue)
	Buffer    int           // batches kept for replay (DefaultBuffer)
	MaxBatch  int           // events per batch (DefaultMaxBatch)
	Flush     time.Duration // longest an event waits for its batch to fill (DefaultFlush)
	Logger    *slog.Logger
	Registry  prometheus.Registerer // nil = none
	SendLimit time.Duration         // bound on one PUB send (1s)
}

type buffered struct {
	seq     uint64
	payload []byte
}

// Publisher publishes KV events. Its methods are safe for concurrent use and never block.
type Publisher struct {
	cfg      Config
	log      *slog.Logger
	ch       chan Event
	pub      zmq4.Socket
	dialed   []zmq4.Socket // one PUB per Config.Connect endpoint
	replay   zmq4.Socket
	cancel   context.CancelFunc
	done     chan struct{}
	loopDone chan struct{}
	wg       sync.WaitGroup

	mu   sync.Mutex // guards ring
	ring []buffered
	next int // ring write position once full

	dropped   atomic.Int64 // events refused by a full queue, not yet shown as a gap
	seq       uint64       // next sequence number (publisher goroutine only)
	closed    atomic.Bool
	closeOnce sync.Once
	startOnce sync.Once

	mEvents, mDropped, mBatches, mErrors, mReplays prometheus.Counter
}

// New binds the endpoints and starts publishing.
func New(cfg Config) (*Publisher, error) {
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = DefaultQueue
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Flush <= 0 {
		cfg.Flush = DefaultFlush
	}
	if cfg.SendLimit <= 0 {
		cfg.SendLimit = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	for _, ep := range cfg.Connect {
		if err := checkEndpoint(ep); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, log: cfg.Logger, ch: make(chan Event, cfg.QueueLen), cancel: cancel, done: make(chan struct{}), loopDone: make(chan struct{})}
	p.pub = zmq4.NewPub(ctx, zmq4.WithTimeout(cfg.SendLimit))
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithTimeout(cfg.SendLimit))
		if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
			cancel()
			p.pub.Close()
			p.replay.Close()
			return nil, fmt.Errorf("kvevents: listen %s: %w", cfg.ReplayEndpoint, err)
		}
	}
	p.metrics(cfg.Registry)
	for _, ep := range cfg.Connect {
		// A socket each: go-zeromq redials only the last endpoint a socket dialled. Dial
		// retries until the subscriber answers or the publisher closes; until then sends
		// to it go nowhere (a PUB without peers), never blocking.
		s := zmq4.NewPub(ctx, zmq4.WithTimeout(cfg.SendLimit), zmq4.WithAutomaticReconnect(true),
			zmq4.WithDialerMaxRetries(-1), zmq4.WithLogger(log.New(io.Discard, "", 0)))
		p.dialed = append(p.dialed, s)
		p.wg.Add(1)
		go func(ep string) {
			defer p.wg.Done()
			if err := s.Dial(ep); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events: dialling a subscriber", "endpoint", ep, "err", err)
			}
		}(ep)
	}
	if p.replay != nil {
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// Start begins publishing what was queued since New, with node as the {node} of the
// topic ("" keeps Config.Node). Events published before Start wait in the queue, so the
// ones a restart produces go out under the node's final name.
func (p *Publisher) Start(node string) {
	p.startOnce.Do(func() {
		if node != "" {
			p.cfg.Node = node
		}
		p.wg.Add(1)
		go p.loop()
	})
}

// checkEndpoint accepts tcp://host:port only: events are for routers on the network.
func checkEndpoint(ep string) error {
	if !strings.HasPrefix(ep, "tcp://") || !strings.Contains(ep[len("tcp://"):], ":") {
		return fmt.Errorf("kvevents: endpoint %q: want tcp://host:port", ep)
	}
	return nil
}

func (p *Publisher) metrics(reg prometheus.Registerer) {
	c := func(name, help string) prometheus.Counter {
		m := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		if reg != nil {
			reg.MustRegister(m)
		}
		return m
	}
	p.mEvents = c("dfkv_kv_events_published_total", "KV events published (BlockStored, BlockRemoved, AllBlocksCleared).")
	p.mDropped = c("dfkv_kv_events_dropped_total", "KV events dropped because the publisher queue was full (each run of drops is a gap in the sequence).")
	p.mBatches = c("dfkv_kv_events_batches_total", "KV event batches published.")
	p.mErrors = c("dfkv_kv_events_send_errors_total", "KV event batches whose PUB send failed.")
	p.mReplays = c("dfkv_kv_events_replays_total", "Replay requests served.")
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_kv_events_queue_depth",
			Help: "KV events waiting for the publisher."}, func() float64 { return float64(len(p.ch)) }))
	}
}

// Addr is the bound PUB endpoint (tcp://host:port), useful with port 0.
func (p *Publisher) Addr() string { return "tcp://" + p.pub.Addr().String() }

// ReplayAddr is the bound replay endpoint, or "".
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return "tcp://" + p.replay.Addr().String()
}

// Dropped is the number of events dropped so far.
func (p *Publisher) Dropped() int64 { return int64(readCounter(p.mDropped)) }

// publish queues ev without blocking: a full queue drops it.
func (p *Publisher) publish(ev Event) {
	if p.closed.Load() {
		return
	}
	select {
	case p.ch <- ev:
	default:
		p.dropped.Add(1)
		p.mDropped.Inc()
	}
}

// Stored publishes BlockStored for t.
func (p *Publisher) Stored(t *wire.ObjectTag) { p.publish(Event{Kind: Stored, Tag: t}) }

// Removed publishes BlockRemoved for t.
func (p *Publisher) Removed(t *wire.ObjectTag) { p.publish(Event{Kind: Removed, Tag: t}) }

// Cleared publishes AllBlocksCleared (on the topic of the empty model label).
func (p *Publisher) Cleared() { p.publish(Event{Kind: Cleared}) }

func (p *Publisher) topic(model string) string {
	return strings.NewReplacer("{node}", p.cfg.Node, "{model}", model).Replace(p.cfg.Topic)
}

func modelOf(ev *Event) string {
	if ev.Tag == nil {
		return ""
	}
	return ev.Tag.Model
}

// loop batches queued events by topic and sends them until Close drains the queue.
func (p *Publisher) loop() {
	defer p.wg.Done()
	defer close(p.loopDone)
	enc := newEncoder(p.cfg.Layout, p.cfg.Medium, p.cfg.Rank)
	var pending []Event
	var order []string
	byTopic := map[string][]Event{}
	flush := func() {
		for _, t := range order {
			evs := byTopic[t]
			for len(evs) > 0 {
				n := min(len(evs), p.cfg.MaxBatch)
				p.send(enc, t, evs[:n])
				evs = evs[n:]
			}
			delete(byTopic, t)
		}
		order = order[:0]
		pending = pending[:0]
	}
	add := func(ev Event) {
		t := p.topic(modelOf(&ev))
		if _, ok := byTopic[t]; !ok {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], ev)
		pending = append(pending, ev)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case ev := <-p.ch:
			if len(pending) == 0 {
				timer.Reset(p.cfg.Flush)
			}
			add(ev)
			if len(pending) >= p.cfg.MaxBatch {
				timer.Stop()
				flush()
			}
		case <-timer.C:
			flush()
		case <-p.done:
			for {
				select {
				case ev := <-p.ch:
					add(ev)
					continue
				default:
				}
				break
			}
			flush()
			return
		}
	}
}

func (p *Publisher) send(enc *encoder, topic string, evs []Event) {
	payload, err := enc.batch(float64(time.Now().UnixNano())/1e9, evs)
	if err != nil {
		p.log.Error("kv events: encoding a batch", "err", err)
		return
	}
	// Dropped events leave a hole in the sequence: a subscriber sees that it missed
	// something (and that replay cannot fill it) and resynchronises.
	if p.dropped.Swap(0) > 0 {
		p.seq++
	}
	seq := p.seq
	p.seq++
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	p.mu.Lock()
	if len(p.ring) < p.cfg.Buffer {
		p.ring = append(p.ring, buffered{seq, payload})
	} else {
		p.ring[p.next] = buffered{seq, payload}
		p.next = (p.next + 1) % len(p.ring)
	}
	p.mu.Unlock()
	msg := zmq4.NewMsgFrom([]byte(topic), sb[:], payload)
	if err := p.pub.Send(msg); err != nil {
		p.mErrors.Inc()
		p.log.Debug("kv events: publishing a batch", "seq", seq, "err", err)
		return
	}
	for _, s := range p.dialed {
		if err := s.Send(msg); err != nil {
			p.mErrors.Inc()
			p.log.Debug("kv events: publishing a batch to a dialled subscriber", "seq", seq, "err", err)
		}
	}
	p.mBatches.Inc()
	p.mEvents.Add(float64(len(evs)))
}

// endSeq ends a replay, as in vLLM: -1 as a signed 8-byte big-endian number.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers [identity, "", start_seq] (a DEALER or REQ peer) with every
// buffered batch from start_seq on, as [identity, "", seq, payload] frames, then
// [identity, "", -1, ""].
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.closed.Load() {
				return
			}
			p.log.Debug("kv events: replay receive", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		f := msg.Frames
		if len(f) == 2 { // a peer that sent no delimiter
			f = [][]byte{f[0], nil, f[1]}
		}
		if len(f) != 3 || len(f[2]) != 8 {
			p.log.Debug("kv events: malformed replay request", "frames", len(msg.Frames))
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		p.mReplays.Inc()
		for _, b := range p.since(start) {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], b.seq)
			if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, sb[:], b.payload)); err != nil {
				break
			}
		}
		_ = p.replay.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) since(start uint64) []buffered {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]buffered, 0, len(p.ring))
	for i := range p.ring {
		b := p.ring[(p.next+i)%len(p.ring)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// Close publishes what is queued (for at most 3s), then closes the sockets.
func (p *Publisher) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.Start("") // a publisher closed before Start still sends what it queued
		p.closed.Store(true)
		close(p.done)
		select {
		case <-p.loopDone:
		case <-time.After(3 * time.Second):
			p.log.Warn("kv events: publisher did not drain in 3s")
		}
		err = errors.Join(p.pub.Close(), closeIf(p.replay))
		for _, s := range p.dialed {
			err = errors.Join(err, s.Close())
		}
		p.cancel()
		p.wg.Wait()
	})
	return err
}

func closeIf(s zmq4.Socket) error {
	if s == nil {
		return nil
	}
	return s.Close()
}
