package server

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Hot objects (docs/ARCHITECTURE.md "Hot objects"): a primary that sees one key read far
// above its other keys copies it to the next ring owners as read replicas, tells its
// readers in GET replies, renews the replicas while the key stays hot and takes them back
// when it cools. Every write of a replicated key invalidates its replicas before it is
// acknowledged, so a replica never serves bytes older than the last acknowledged write.

// HotPeers is how a primary reaches the nodes that hold its replicas (cmd/server
// implements it over the client library and the node's membership view).
type HotPeers interface {
	// Replicas returns the addresses of up to n nodes following id's owner on the ring, in
	// ring order, and whether this node is that owner.
	Replicas(id identity.ObjectID, n int) (addrs []string, primary bool)
	// Push stores value as addr's replica of key, generation gen, valid for lease, and
	// returns the reads addr served from its replica of key since the previous push.
	Push(ctx context.Context, addr string, key store.Key, gen uint64, lease time.Duration, value []byte) (reads uint64, err error)
	// Invalidate drops addr's replica of key and makes it refuse generations below gen.
	Invalidate(ctx context.Context, addr string, key store.Key, gen uint64) error
}

// HotConfig configures hot-object spreading. Zero values take the defaults noted.
type HotConfig struct {
	Peers HotPeers // required
	// A key is hot when, over one Interval, its estimated reads k (its reads here plus those
	// its replicas reported at the last renewal; at least its reads here times the copies
	// serving it) reach MinReads and Share of this node's other reads; it then gets
	// ceil(k / (Share × other)) - 1 replicas, at most MaxReplicas.
	Interval time.Duration // default 1s
	MinReads int           // default 64
	Share    float64       // default 0.1
	// Factor: a hot key is also read at least Factor times the mean rate of the node's
	// other keys (their reads / their estimated count), so a node with few keys evenly read
	// never replicates, while one dominant key among few others does (default 8).
	Factor      float64
	MaxReplicas int           // default 8 (wire.MaxHotReplicas at most)
	MaxHot      int           // keys replicated from here at once, default 32
	MaxValue    int           // largest value replicated, default 4 MiB
	Lease       time.Duration // replica lifetime without renewal, default 3s
	RPCTimeout  time.Duration // per push or invalidation, default 1s
	// MaxReplicaKeys bounds the replicas this node holds for other primaries (default 1024).
	MaxReplicaKeys int
	// NoInvalidate is a test hook: writes leave the replicas in place. The e2e test shows
	// that reads then return overwritten bytes; never set it in production.
	NoInvalidate bool
	Logger       *slog.Logger
}

func (c *HotConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.MinReads <= 0 {
		c.MinReads = 64
	}
	if c.Share <= 0 {
		c.Share = 0.1
	}
	if c.Factor <= 0 {
		c.Factor = 8
	}
	if c.MaxReplicas <= 0 {
		c.MaxReplicas = 8
	}
	c.MaxReplicas = min(c.MaxReplicas, wire.MaxHotReplicas)
	if c.MaxHot <= 0 {
		c.MaxHot = 32
	}
	if c.MaxValue <= 0 {
		c.MaxValue = 4 << 20
	}
	if c.Lease <= 0 {
		c.Lease = 3 * time.Second
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = time.Second
	}
	if c.MaxReplicaKeys <= 0 {
		c.MaxReplicaKeys = 1024
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

const (
	sketchRows = 4
	sketchCols = 1024 // count-min: 16 KiB, fixed whatever the key count
	// distinctBits estimates the distinct keys read per interval (linear counting, 512 B).
	distinctBits = 4096
	maxCand      = 64 // keys counted exactly once their estimate passes MinReads/4
	pushParallel = 16 // replica pushes of one key in flight at once
	// skipPrimaryFrom: with this many replicas serving a key, its readers leave the primary
	// out of their rotation (wire.Hot.SkipPrimary). The primary also serves the key's replica
	// misses, the readers still without the hint and the key's writes; with an equal share on
	// top of those the block-0 primary stayed the busiest node at 128 nodes (1.26× the mean).
	// Below it the share a replica would take over is too large a step.
	skipPrimaryFrom = 4
	quietRounds     = 3 // intervals below the threshold before replicas are taken back
	// replicaSalt moves replica bytes into a tenant of their own in the engine, so they count
	// against capacity and are evicted like any value but never answer a normal key.
	replicaSalt uint64 = 0x9e3779b97f4a7c15
	// tombstoneFor keeps a replica's generation after it is dropped, so a push of an older
	// generation that arrives late is refused.
	tombstoneFor = 2 * time.Minute
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errReplicaStale: a push of a generation older than one this node has seen.
var errReplicaStale = errors.New("server: stale replica generation")

// Hot is one node's hot-object state: the heat sketch and replicas it made as a primary,
// and the replicas it holds for other primaries.
type Hot struct {
	cfg  HotConfig
	eng  store.Engine
	log  *slog.Logger
	gen  atomic.Uint64
	stop chan struct{}
	done chan struct{}
	once sync.Once
	// early asks the loop to end the interval now: a key without replicas passed MinReads
	// well before the interval's end (waiting for the tick left a new hot key's primary
	// serving it alone for up to an interval).
	early chan struct{}

	mu      sync.Mutex
	sketch  [sketchRows][sketchCols]uint32
	seen    [distinctBits / 64]uint64 // linear counting of the distinct keys read
	total   uint64                    // reads this interval
	began   time.Time                 // when this interval began
	minCand *candidate                // the weakest candidate: replaced by a warmer key
	cand    map[store.Key]*candidate  // exact counts of the warmest keys
	entries map[store.Key]*hotEntry   // keys with replicas that may still hold

	rmu  sync.Mutex
	reps map[store.Key]*replica // replicas held here for other primaries

	made, dropped, invalidated, waits, fallbackReads prometheus.Counter
	replicaReads                                     *prometheus.CounterVec
}

type candidate struct {
	key   store.Key
	reads uint64
	quiet int
	early bool // asked for an early end of this interval
}

// hotEntry is a replicated key on its primary. mu serializes making, renewing and dropping
// its replicas with the invalidation a write does, so a copy is either made before a write
// (and invalidated by it) or after it (and holds the new bytes).
type hotEntry struct {
	mu      sync.Mutex
	want    int
	holders map[string]time.Time // addr -> latest instant its replica can still be served
	// valid: addr -> earliest instant its replica's lease can end (the send time of its last
	// acknowledged push + lease): a renewal that fails leaves the older copy serving.
	valid map[string]time.Time
	hint  atomic.Uint64 // replicas<<56 | skip-primary<<55 | unix-millisecond end of the advertised window
	// reported: the reads the replicas said they served, summed over the last renewal.
	reported atomic.Uint64
}

const (
	hintSkip = 1 << 55
	hintMS   = hintSkip - 1
)

type replica struct {
	gen   uint64
	reads uint64 // served since the last push (reported in its reply)
	valid bool
	until time.Time // valid until (this node's clock)
	dead  time.Time // tombstone: meta kept until then
	crc   uint32
	size  int
}

// NewHot returns the hot-object state of a node serving eng; Start runs its interval loop.
func NewHot(cfg HotConfig, eng store.Engine, reg prometheus.Registerer) (*Hot, error) {
	if cfg.Peers == nil {
		return nil, errors.New("server: hot spreading without peers")
	}
	cfg.setDefaults()
	h := &Hot{cfg: cfg, eng: eng, log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{}), early: make(chan struct{}, 1),
		cand: map[store.Key]*candidate{}, entries: map[store.Key]*hotEntry{}, reps: map[store.Key]*replica{}}
	// Generations grow across restarts too: a late push from a previous run is older.
	h.gen.Store(uint64(time.Now().UnixNano()))
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_server_hot_" + name, Help: help})
	}
	h.made = counter("replicas_made_total", "Replicas pushed to other nodes (first copies and renewals).")
	h.dropped = counter("replicas_dropped_total", "Replicas taken back because their key cooled down.")
	h.invalidated = counter("replicas_invalidated_total", "Replicas invalidated by a write of their key.")
	h.waits = counter("invalidation_waits_total", "Writes that waited out an unreachable replica's lease before their reply.")
	h.fallbackReads = counter("replica_stale_reads_total", "Replica reads refused because the bytes did not match the replica's CRC or size.")
	h.replicaReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_server_hot_replica_reads_total",
		Help: "Reads of replicas held here, by result (hit, miss)."}, []string{"result"})
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_server_hot_" + name, Help: help}, f)
	}
	cols := []prometheus.Collector{h.made, h.dropped, h.invalidated, h.waits, h.fallbackReads, h.replicaReads,
		gauge("tracked_keys", "Keys counted exactly by the heat table (at most 64; the sketch itself is fixed-size).", func() float64 {
			h.mu.Lock()
			defer h.mu.Unlock()
			return float64(len(h.cand))
		}),
		gauge("sketch_bytes", "Bytes of the count-min heat sketch.", func() float64 { return sketchRows * sketchCols * 4 }),
		gauge("keys", "Keys of this primary with replicas on other nodes.", func() float64 {
			h.mu.Lock()
			defer h.mu.Unlock()
			return float64(len(h.entries))
		}),
		gauge("replica_bytes", "Bytes of valid replicas held here for other primaries (charged to capacity like any value).", func() float64 {
			h.rmu.Lock()
			defer h.rmu.Unlock()
			n, now := 0, time.Now()
			for _, r := range h.reps {
				if r.valid && now.Before(r.until) {
					n += r.size
				}
			}
			return float64(n)
		}),
	}
	for _, c := range cols {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: hot metrics: %w", err)
		}
	}
	return h, nil
}

// Start runs the interval loop until Close.
func (h *Hot) Start() {
	h.mu.Lock()
	h.began = time.Now()
	h.mu.Unlock()
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				h.tick(false)
			case <-h.early:
				h.tick(true)
				t.Reset(h.cfg.Interval)
			}
		}
	}()
}

// Close stops the loop (replicas elsewhere expire with their leases).
func (h *Hot) Close() {
	h.once.Do(func() { close(h.stop) })
	select {
	case <-h.done:
	case <-time.After(h.cfg.Interval + 2*time.Duration(h.cfg.MaxReplicas+1)*h.cfg.RPCTimeout):
	}
}

func sketchHash(key store.Key, row int) uint64 {
	x := key.ID.Hi*0x9e3779b97f4a7c15 + key.ID.Lo*0xc2b2ae3d27d4eb4f + key.Tenant*0x165667b19e3779f9 + uint64(row+1)*0xbf58476d1ce4e5b9
	x ^= x >> 31
	x *= 0x94d049bb133111eb
	x ^= x >> 29
	return x
}

func sketchIndex(key store.Key, row int) int { return int(sketchHash(key, row) % sketchCols) }

// noteRead counts a primary read of key and returns the hint for its reply.
func (h *Hot) noteRead(key store.Key) wire.Hot {
	if h == nil {
		return wire.Hot{}
	}
	h.mu.Lock()
	h.total++
	b := sketchHash(key, sketchRows) % distinctBits
	h.seen[b/64] |= 1 << (b % 64)
	if c := h.cand[key]; c != nil {
		c.reads++
		// Not before a quarter interval, so that the other keys' mean means something and a
		// key the tick declines cannot make the loop spin.
		if !c.early && c.reads >= uint64(h.cfg.MinReads) && h.entries[key] == nil && time.Since(h.began) >= h.cfg.Interval/4 {
			c.early = true
			select {
			case h.early <- struct{}{}:
			default:
			}
		}
	} else {
		est := uint32(math.MaxUint32)
		for r := 0; r < sketchRows; r++ {
			i := sketchIndex(key, r)
			h.sketch[r][i]++
			est = min(est, h.sketch[r][i])
		}
		if int(est) >= h.cfg.MinReads/4 {
			h.admit(key, uint64(est))
		}
	}
	e := h.entries[key]
	h.mu.Unlock()
	if e == nil {
		return wire.Hot{}
	}
	w := e.hint.Load()
	left := int64(w&hintMS) - time.Now().UnixMilli()
	if w == 0 || left <= 0 {
		return wire.Hot{}
	}
	// Clients may keep the hint well past the current copies' lease: renewals extend it while
	// the key stays hot, and a client that finds a replica gone reads the primary, whose
	// reply then corrects or withdraws the hint. A short hint sent every reader back to the
	// primary every lease (the 32-node replay's busiest node).
	return wire.Hot{Replicas: uint8(w >> 56), ValidMS: uint32(min(left+4*h.cfg.Lease.Milliseconds(), wire.MaxHotValidMS)), SkipPrimary: w&hintSkip != 0}
}

// admit makes key a candidate, replacing the weakest one (never a replicated key) when the
// table is full and key is warmer. Called with h.mu held.
func (h *Hot) admit(key store.Key, est uint64) {
	if len(h.cand) >= maxCand {
		if h.minCand == nil {
			for _, c := range h.cand {
				if h.entries[c.key] == nil && (h.minCand == nil || c.reads < h.minCand.reads) {
					h.minCand = c
				}
			}
		}
		if h.minCand == nil || h.minCand.reads >= est {
			return
		}
		delete(h.cand, h.minCand.key)
		h.minCand = nil
	}
	h.cand[key] = &candidate{key: key, reads: est}
}

// distinct estimates the keys read this interval from the linear-counting bitmap.
func (h *Hot) distinct() float64 {
	zero := 0
	for _, w := range h.seen {
		zero += 64 - bits.OnesCount64(w)
	}
	if zero == 0 {
		zero = 1
	}
	return -distinctBits * math.Log(float64(zero)/distinctBits)
}

// tick ends an interval: it decides which keys want replicas and makes, renews or drops them.
// early: the interval is cut short (a new key passed MinReads).
func (h *Hot) tick(early bool) {
	type decision struct {
		key  store.Key
		want int
	}
	var ds []decision
	h.mu.Lock()
	others := math.Max(h.distinct()-1, 1)
	// An interval ended early is shorter: MinReads is per full interval.
	minReads := float64(h.cfg.MinReads)
	if early {
		minReads *= min(1, float64(time.Since(h.began))/float64(h.cfg.Interval))
	}
	for key, c := range h.cand {
		copies, scale, reported := 1, 1.0, 0.0
		if e := h.entries[key]; e != nil {
			w := e.hint.Load()
			copies += int(w >> 56)
			scale = float64(copies)
			if w&hintSkip != 0 {
				scale = 1 // the primary serves only misses and hintless readers
			}
			reported = float64(e.reported.Load())
		}
		// The replicas' reports are exact but an interval old; without them (none yet, or an
		// older replica that reports 0) the primary's own share, scaled, stands in.
		k := math.Max(float64(c.reads)+reported, float64(c.reads)*scale)
		other := math.Max(float64(h.total)-float64(c.reads), 1)
		// Hysteresis: a replicated key stays hot down to half the thresholds, so a key near
		// them is not dropped and re-made every few intervals (its readers then all return
		// to the primary at once).
		bar := 1.0
		if copies > 1 {
			bar = 0.5
		}
		want := 0
		mean := (float64(h.total) - float64(c.reads)) / others
		if k >= bar*minReads && k >= bar*h.cfg.Factor*mean {
			want = int(math.Ceil(k/(h.cfg.Share*other))) - 1
			if copies > 1 {
				want = max(want, 1)
			}
		}
		want = max(0, min(want, h.cfg.MaxReplicas))
		if want == 0 {
			c.quiet++
		} else {
			c.quiet = 0
		}
		e := h.entries[key]
		switch {
		case want > 0 && (e != nil || len(h.entries) < h.cfg.MaxHot):
			ds = append(ds, decision{key, want})
		case e != nil && c.quiet < quietRounds:
			ds = append(ds, decision{key, e.want}) // keep (renew) through a short lull
		}
		c.reads, c.early = 0, false
		if c.quiet >= quietRounds && e == nil {
			delete(h.cand, key)
		}
	}
	for key := range h.entries {
		if c := h.cand[key]; c == nil || c.quiet >= quietRounds {
			ds = append(ds, decision{key, 0})
			delete(h.cand, key)
		}
	}
	h.sketch = [sketchRows][sketchCols]uint32{}
	h.seen = [distinctBits / 64]uint64{}
	h.total, h.minCand = 0, nil
	h.began = time.Now()
	h.mu.Unlock()
	for _, d := range ds {
		h.refresh(d.key, d.want)
	}
	h.sweepReplicas()
}

// entryFor returns key's entry, locked; a new one is created when create is set. The entry
// is in the map before its lock is released, so a write that finds no entry has finished
// in the engine before any copy of the key is read (see hotEntry).
func (h *Hot) entryFor(key store.Key, create bool) *hotEntry {
	h.mu.Lock()
	e := h.entries[key]
	if e == nil && create {
		e = &hotEntry{holders: map[string]time.Time{}, valid: map[string]time.Time{}}
		h.entries[key] = e
	}
	h.mu.Unlock()
	if e != nil {
		e.mu.Lock()
	}
	return e
}

// refresh makes or renews want replicas of key, or takes them back when want is 0.
func (h *Hot) refresh(key store.Key, want int) {
	e := h.entryFor(key, want > 0)
	if e == nil {
		return
	}
	defer e.mu.Unlock()
	var addrs []string
	if want > 0 {
		var primary bool
		addrs, primary = h.cfg.Peers.Replicas(key.ID, want)
		if !primary {
			addrs = nil // the ring moved: the new owner decides
		}
	}
	var value []byte
	if len(addrs) > 0 {
		err := h.eng.Get(key, func(v []byte) error {
			if len(v) > h.cfg.MaxValue {
				return store.ErrTooLarge
			}
			value = append([]byte(nil), v...)
			return nil
		})
		if err != nil {
			addrs, value = nil, nil
		}
	}
	keep := map[string]bool{}
	// reported replaces the last renewal's sum every time, with 0 when nothing was pushed
	// (cooled, moved ring, value gone): a stale sum would keep a dropped key looking hot.
	var reported uint64
	defer func() { e.reported.Store(reported) }()
	served := 0
	var until time.Time
	if len(addrs) > 0 {
		gen := h.gen.Add(1)
		// Pushes run in parallel (at most pushParallel at once): one after another, renewing
		// a key's 127 replicas on a loaded node took longer than the interval, and copies
		// whose lease was near its end fell out of the hint.
		type pushed struct {
			sent  time.Time
			reads uint64
			err   error
		}
		res := make([]pushed, len(addrs))
		sem := make(chan struct{}, pushParallel)
		var wg sync.WaitGroup
		for i, a := range addrs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				res[i].sent = time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), h.cfg.RPCTimeout)
				res[i].reads, res[i].err = h.cfg.Peers.Push(ctx, a, key, gen, h.cfg.Lease, value)
				cancel()
			}()
		}
		wg.Wait()
		// Acked or not, a replica may hold the bytes until a lease after now: it starts its
		// lease when it takes the push, which is before this point when acked (and, per the
		// design's bound, within the RPC timeout when not).
		held := time.Now().Add(h.cfg.Lease)
		for i, a := range addrs {
			h.holdUntil(e, a, held)
			keep[a] = true
			if res[i].err != nil {
				h.log.Debug("hot replica push failed", "addr", a, "id", key.ID, "err", res[i].err)
				continue
			}
			h.made.Inc()
			reported += res[i].reads
			e.valid[a] = res[i].sent.Add(h.cfg.Lease)
		}
		// The hint names the replicas in ring order up to the first without a valid copy.
		now := time.Now()
		for _, a := range addrs {
			t, ok := e.valid[a]
			if !ok || t.Before(now.Add(h.cfg.Lease/4)) {
				break
			}
			served++
			if until.IsZero() || t.Before(until) {
				until = t
			}
		}
	}
	// Clients stop reading replicas a quarter lease before the first one expires.
	if served > 0 {
		end := until.Add(-h.cfg.Lease / 4)
		w := uint64(served)<<56 | uint64(end.UnixMilli())&hintMS
		if served >= skipPrimaryFrom {
			w |= hintSkip
		}
		e.hint.Store(w)
	} else {
		e.hint.Store(0)
	}
	e.want = want
	// Replicas no longer wanted (cooled key, smaller want, moved ring) are taken back.
	gen := uint64(0)
	for a := range e.holders {
		if keep[a] {
			continue
		}
		if gen == 0 {
			gen = h.gen.Add(1)
		}
		delete(e.valid, a)
		if h.invalidateOne(a, key, gen) {
			delete(e.holders, a)
			h.dropped.Inc()
		}
	}
	h.expireHolders(e)
	if len(e.holders) == 0 && served == 0 {
		h.mu.Lock()
		if h.entries[key] == e {
			delete(h.entries, key)
		}
		h.mu.Unlock()
	}
}

func (h *Hot) holdUntil(e *hotEntry, addr string, t time.Time) {
	if t.After(e.holders[addr]) {
		e.holders[addr] = t
	}
}

// expireHolders forgets replicas whose lease has surely ended.
func (h *Hot) expireHolders(e *hotEntry) {
	now := time.Now()
	for a, t := range e.holders {
		if now.After(t) {
			delete(e.holders, a)
		}
	}
}

func (h *Hot) invalidateOne(addr string, key store.Key, gen uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.RPCTimeout)
	defer cancel()
	if err := h.cfg.Peers.Invalidate(ctx, addr, key, gen); err != nil {
		h.log.Debug("hot replica invalidation failed", "addr", addr, "id", key.ID, "err", err)
		return false
	}
	return true
}

// wrote runs after every write (PUT-like or REMOVE) of key reached the engine and before it
// is acknowledged: replicas of key are invalidated, and one that cannot be reached is waited
// out (its lease, bounded) so no reader can be served the bytes this write replaced.
func (h *Hot) wrote(key store.Key) {
	if h == nil {
		return
	}
	e := h.entryFor(key, false)
	if e == nil {
		return
	}
	defer e.mu.Unlock()
	e.hint.Store(0)
	clear(e.valid) // the copies hold the old bytes: the next interval makes new ones
	if h.cfg.NoInvalidate {
		return
	}
	gen := h.gen.Add(1)
	var wait time.Time
	for a, t := range e.holders {
		if h.invalidateOne(a, key, gen) {
			h.invalidated.Inc()
		} else if t.After(wait) {
			wait = t
		}
		delete(e.holders, a)
	}
	if d := time.Until(wait); d > 0 {
		h.waits.Inc()
		time.Sleep(min(d, h.cfg.Lease+h.cfg.RPCTimeout))
	}
}

func replicaKey(key store.Key) store.Key {
	return store.Key{ID: key.ID, Tenant: key.Tenant ^ replicaSalt}
}

// putReplica stores a replica pushed by key's primary. fill reads the value (from the
// socket) into the engine's buffer.
func (h *Hot) putReplica(key store.Key, gen uint64, lease time.Duration, size int, fill func([]byte) error) error {
	if size > h.cfg.MaxValue {
		return fmt.Errorf("%w: replica of %d bytes", store.ErrTooLarge, size)
	}
	lease = min(lease, wire.MaxLeaseMS*time.Millisecond)
	h.rmu.Lock()
	r := h.reps[key]
	if r != nil && (gen < r.gen || gen == r.gen && !r.valid) {
		h.rmu.Unlock()
		return errReplicaStale
	}
	if r == nil {
		if len(h.reps) >= h.cfg.MaxReplicaKeys {
			h.rmu.Unlock()
			return fmt.Errorf("%w: %d replicas held", store.ErrCacheFull, len(h.reps))
		}
		r = &replica{}
		h.reps[key] = r
	}
	// A renewal finds the held copy valid and inside its lease: no write happened since it
	// was pushed (a write invalidates it first, or waits out its lease), so it is still the
	// current value and stays servable while the new bytes arrive; a read that meets new,
	// different bytes fails the old CRC and misses. Turning it off for every renewal made
	// ~1% of a hot key's replica reads fall back to its primary (128-node replay).
	if !r.valid || !time.Now().Before(r.until) {
		r.valid = false
	}
	r.gen = gen
	h.rmu.Unlock()
	var crc uint32
	err := h.eng.Put(replicaKey(key), size, func(dst []byte) error {
		if err := fill(dst); err != nil {
			return err
		}
		crc = crc32.Checksum(dst, castagnoli)
		return nil
	})
	h.rmu.Lock()
	defer h.rmu.Unlock()
	if err != nil {
		if r.gen == gen {
			r.valid = false
		}
		return err
	}
	if r.gen != gen { // invalidated or replaced while the bytes arrived
		return errReplicaStale
	}
	r.valid, r.until, r.crc, r.size = true, time.Now().Add(lease), crc, size
	r.dead = r.until.Add(tombstoneFor)
	return nil
}

// takeReplicaReads returns the reads served from the replica of key since the last call
// (a push's reply carries them to the primary).
func (h *Hot) takeReplicaReads(key store.Key) uint64 {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	r := h.reps[key]
	if r == nil {
		return 0
	}
	n := r.reads
	r.reads = 0
	return n
}

// invalidateReplica drops the replica of key held here and refuses generations below gen.
func (h *Hot) invalidateReplica(key store.Key, gen uint64) {
	h.rmu.Lock()
	r := h.reps[key]
	if r == nil {
		if len(h.reps) >= h.cfg.MaxReplicaKeys {
			h.rmu.Unlock()
			return // nothing held; a later older push is refused by the primary's own order
		}
		r = &replica{}
		h.reps[key] = r
	}
	r.gen = max(r.gen, gen)
	r.valid = false
	r.dead = time.Now().Add(tombstoneFor)
	h.rmu.Unlock()
	_ = h.eng.Remove(replicaKey(key))
}

// getReplica serves the replica of key held here through serve, or reports a miss.
func (h *Hot) getReplica(key store.Key, serve func([]byte) error) error {
	h.rmu.Lock()
	r := h.reps[key]
	ok := r != nil && r.valid && time.Now().Before(r.until)
	var crc uint32
	var size int
	if ok {
		crc, size = r.crc, r.size
		r.reads++ // a stale copy's misses count too: its readers wanted this key
	}
	h.rmu.Unlock()
	if !ok {
		h.replicaReads.WithLabelValues("miss").Inc()
		return store.ErrNotFound
	}
	stale := false
	err := h.eng.Get(replicaKey(key), func(v []byte) error {
		if len(v) != size || crc32.Checksum(v, castagnoli) != crc {
			stale = true // replaced in the engine by a newer push or a foreign write
			return store.ErrNotFound
		}
		return serve(v)
	})
	if stale {
		h.fallbackReads.Inc()
	}
	if err != nil && (stale || errors.Is(err, store.ErrNotFound)) {
		h.replicaReads.WithLabelValues("miss").Inc()
		return store.ErrNotFound
	}
	if err == nil {
		h.replicaReads.WithLabelValues("hit").Inc()
	}
	return err
}

// sweepReplicas frees the bytes of expired replicas and forgets old tombstones.
func (h *Hot) sweepReplicas() {
	now := time.Now()
	var free []store.Key
	h.rmu.Lock()
	for k, r := range h.reps {
		if r.valid && now.After(r.until) {
			r.valid = false
			free = append(free, k)
		}
		if !r.valid && now.After(r.dead) {
			delete(h.reps, k)
		}
	}
	h.rmu.Unlock()
	for _, k := range free {
		_ = h.eng.Remove(replicaKey(k))
	}
}
