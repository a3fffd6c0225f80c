//go:build linux

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
)

type options struct {
	target    string
	members   string
	node      string
	addr      string
	file      string
	ns        string
	op        string
	readRatio float64
	size      cli.Size
	conns     int
	batch     int
	bconc     int
	poolSize  int
	keys      int
	distinct  bool
	keyBase   uint64
	count     int64
	duration  time.Duration
	maxTime   time.Duration
	warmup    time.Duration
	seed      bool
	verify    bool
	strict    bool
	getAuto   bool
	blocking  bool
	ioTimeout time.Duration
	jsonOut   bool
	cpuprof   string
	label     string
	tlsCA     string
	tlsCert   string
	tlsKey    string
	token     string
	transport string
	rdmaProv  string
	rdmaDev   string
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: dfkv_bench [flags]                 load generator (see flags)
       dfkv_bench rawserver [--listen 127.0.0.1:0] [--addr-file F] [--max-size 64MiB]
       dfkv_bench odirect-prep --file F --bytes N    (prepare the file of --target odirect)
       dfkv_bench trace --trace F --members ... --block-bytes N   (hit rate on a trace; trace -h)
exit status: 0 ok, 1 some item failed (or missed with --strict), 2 setup error
flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func parseFlags(args []string, stderr io.Writer) (*options, int, bool) {
	o := &options{size: 1 << 20}
	fs := flag.NewFlagSet("dfkv_bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.target, "target", "dfkv", "system under test: dfkv, rawtcp, redis, memcached, odirect")
	fs.StringVar(&o.members, "members", "", "dfkv nodes: id=host:port[,id=host:port...]")
	fs.StringVar(&o.node, "node", "", "one dfkv node host:port (instead of --members)")
	fs.StringVar(&o.addr, "addr", "", "host:port of a baseline server (rawtcp, redis, memcached)")
	fs.StringVar(&o.file, "file", "", "odirect: file to read/write with O_DIRECT (from `dfkv_bench odirect-prep`)")
	fs.StringVar(&o.ns, "ns", "bench", "namespace (dfkv) and key prefix (every target)")
	fs.StringVar(&o.op, "op", "get", "put, get, exist or mixed")
	fs.Float64Var(&o.readRatio, "read-ratio", 0.9, "mixed: fraction of calls that are gets (the rest puts)")
	fs.Var(&o.size, "size", "value size (bytes; KiB/MiB suffixes)")
	fs.IntVar(&o.conns, "conns", 4, "concurrent workers (baselines: one TCP connection each)")
	fs.IntVar(&o.batch, "batch", 1, "items per call (1 = single ops; baselines pipeline)")
	fs.IntVar(&o.bconc, "batch-concurrency", 4, "dfkv: chunks in flight per batch call")
	fs.IntVar(&o.poolSize, "pool-size", 0, "dfkv: idle connections kept per peer (0: max(16, conns*batch-concurrency))")
	fs.IntVar(&o.keys, "keys", 0, "key space (default: ~256 MiB of values, 64..65536 keys)")
	fs.BoolVar(&o.distinct, "distinct", false, "every item uses a new key (--key-base, +1, ...) instead of random keys of --keys: PUTs that never overwrite")
	fs.Uint64Var(&o.keyBase, "key-base", 0, "with --distinct: the first key index (use a fresh range per run against one server)")
	fs.Int64Var(&o.count, "count", 0, "stop after this many items (0 = by --duration)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measurement length (with --count: only if given)")
	fs.DurationVar(&o.maxTime, "max-time", 10*time.Minute, "hard limit on the measurement; reaching it is a failure")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before the measurement")
	fs.BoolVar(&o.seed, "seed", false, "PUT every key of the key space first (for get/exist/mixed)")
	fs.BoolVar(&o.verify, "verify", true, "check each GET's key stamp (not for rawtcp)")
	fs.BoolVar(&o.strict, "strict", false, "count misses as failures (exit 1)")
	fs.BoolVar(&o.getAuto, "get-auto", false, "dfkv: GetAuto/BatchGet(Auto) instead of exact-size gets")
	fs.BoolVar(&o.blocking, "blocking-io", false, "dfkv: blocking socket calls on the worker's thread (client.Options.BlockingIO, as the C ABI uses) instead of the netpoller")
	fs.DurationVar(&o.ioTimeout, "io-timeout", 5*time.Second, "per-call I/O deadline")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the measurement phase here")
	fs.StringVar(&o.label, "label", "", "free-form label copied into the result")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "dfkv: connect with TLS 1.3, verifying nodes against this PEM CA")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "dfkv: client certificate (mTLS)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "dfkv: private key of --tls-cert")
	fs.StringVar(&o.token, "token", "", "dfkv: tenant token (nodes run with --auth-tokens)")
	fs.StringVar(&o.transport, "transport", "tcp", "dfkv: tcp, or rdma (v2 one-sided; docs/RDMA.md; fails unless RDMA is in use)")
	fs.StringVar(&o.rdmaProv, "rdma-provider", "ibverbs", "dfkv --transport rdma: ibverbs, or soft (software NIC; no performance meaning)")
	fs.StringVar(&o.rdmaDev, "rdma-dev", "", "dfkv --transport rdma: the client's device (default: the first with an ACTIVE port)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stderr, fs)
			return nil, exitOK, false
		}
		fmt.Fprintln(stderr, "dfkv_bench:", err)
		usage(stderr, fs)
		return nil, exitSetup, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dfkv_bench: unexpected argument %q\n", fs.Arg(0))
		return nil, exitSetup, false
	}
	durSet := false
	fs.Visit(func(f *flag.Flag) { durSet = durSet || f.Name == "duration" })
	if o.count > 0 && !durSet {
		o.duration = 0 // count-bounded; --max-time still applies
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "dfkv_bench:", err)
		return nil, exitSetup, false
	}
	return o, 0, true
}

func (o *options) validate() error {
	switch o.op {
	case "put", "get", "exist", "mixed":
	default:
		return fmt.Errorf("bad --op %q (want put, get, exist or mixed)", o.op)
	}
	if o.size <= 0 || o.size > 1<<30 {
		return fmt.Errorf("--size must be in (0, 1GiB]")
	}
	if o.conns < 1 || o.conns > 4096 {
		return fmt.Errorf("--conns must be in [1, 4096]")
	}
	if o.batch < 1 || o.batch > 4096 {
		return fmt.Errorf("--batch must be in [1, 4096]")
	}
	if o.readRatio < 0 || o.readRatio > 1 {
		return fmt.Errorf("--read-ratio must be in [0, 1]")
	}
	if o.keys == 0 {
		o.keys = int(min(65536, max(64, (256<<20)/int64(o.size))))
	}
	if o.keys < 1 {
		return fmt.Errorf("--keys must be positive")
	}
	if o.distinct && (o.op != "put" || o.seed || o.keyBase >= 1e9) {
		return fmt.Errorf("--distinct is for --op put without --seed, with --key-base below 1e9 (keys have %d digits)", keyDigits)
	}
	if o.count < 0 || o.duration < 0 || o.warmup < 0 || o.maxTime <= 0 {
		return fmt.Errorf("--count, --duration, --warmup must be >= 0 and --max-time > 0")
	}
	if o.count == 0 && o.duration == 0 {
		return fmt.Errorf("need --duration or --count")
	}
	// Buffers: each worker holds batch values and batch get buffers.
	need := int64(o.conns) * int64(o.batch) * int64(o.size) * 2
	if need > 8<<30 {
		return fmt.Errorf("conns*batch*size*2 = %d bytes of buffers is over the 8 GiB the harness allows", need)
	}
	if o.target == "odirect" && o.op == "exist" {
		return fmt.Errorf("--target odirect supports --op get, put and mixed, not %s", o.op)
	}
	if o.node != "" && o.addr == "" {
		o.addr = o.node
	}
	return nil
}

// result is what one run reports (the --json object).
type result struct {
	Label      string   `json:"label,omitempty"`
	Target     string   `json:"target"`
	Op         string   `json:"op"`
	Size       int64    `json:"size"`
	Conns      int      `json:"conns"`
	Batch      int      `json:"batch"`
	Keys       int      `json:"keys"`
	Seconds    float64  `json:"seconds"`
	Items      uint64   `json:"items"`
	Calls      uint64   `json:"calls"`
	Bytes      uint64   `json:"bytes"`
	Errors     uint64   `json:"errors"`
	Misses     uint64   `json:"misses"`
	OpsPerSec  float64  `json:"ops_per_s"`
	GBPerSec   float64  `json:"gb_per_s"`
	Latency    latStats `json:"latency_us"`
	FirstError string   `json:"first_error,omitempty"`
	TimedOut   bool     `json:"timed_out,omitempty"`
	SeedSecs   float64  `json:"seed_seconds,omitempty"`
}

type latStats struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func latOf(h *hist) latStats {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return latStats{P50: us(h.percentile(0.50)), P90: us(h.percentile(0.90)), P99: us(h.percentile(0.99)),
		P999: us(h.percentile(0.999)), Max: us(h.max), Mean: us(h.mean())}
}

// worker is one load goroutine's state; everything the loop touches is allocated up front.
type worker struct {
	t       target
	c       conn
	rng     *rand.Rand
	keyBuf  []byte // batch keys, keyLen bytes each
	keyLen  int
	prefix  int // bytes of ns+":" at the head of each key
	keys    [][]byte
	vals    [][]byte
	bufs    [][]byte
	idx     []uint64
	res     []error
	h       hist
	items   uint64
	calls   uint64
	bytes   uint64
	errs    uint64
	misses  uint64
	firstEr error
}

const keyDigits = 10

func newWorker(o *options, c conn, seed uint64) *worker {
	w := &worker{c: c, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	w.prefix = len(o.ns) + 1
	w.keyLen = w.prefix + keyDigits
	w.keyBuf = make([]byte, w.keyLen*o.batch)
	w.keys = make([][]byte, o.batch)
	w.idx = make([]uint64, o.batch)
	w.res = make([]error, o.batch)
	for i := range w.keys {
		k := w.keyBuf[i*w.keyLen : (i+1)*w.keyLen]
		copy(k, o.ns)
		k[len(o.ns)] = ':'
		w.keys[i] = k
	}
	size := int(o.size)
	if o.op == "put" || o.op == "mixed" || o.seed {
		w.vals = make([][]byte, o.batch)
		for i := range w.vals {
			v := make([]byte, size)
			for j := range v { // touch every page now, not during the measurement
				v[j] = byte(seed) + byte(j*131) + byte(i)
			}
			w.vals[i] = v
		}
	}
	if o.op == "get" || o.op == "mixed" {
		w.bufs = make([][]byte, o.batch)
		for i := range w.bufs {
			b := make([]byte, size)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			w.bufs[i] = b
		}
	}
	return w
}

// setKey makes item slot j name key i: its zero-padded decimal index after the prefix.
func (w *worker) setKey(j int, i uint64) {
	w.idx[j] = i
	k := w.keys[j]
	for p := len(k) - 1; p >= w.prefix; p-- {
		k[p] = byte('0' + i%10)
		i /= 10
	}
}

func stamp(v []byte, i uint64) {
	if len(v) >= 8 {
		binary.LittleEndian.PutUint64(v, i)
	}
}

func stamped(v []byte, i uint64) bool {
	return len(v) < 8 || binary.LittleEndian.Uint64(v) == i
}

// call runs one call of n items with keys already set; it returns its latency.
func (w *worker) call(op string, n int, verify bool) (time.Duration, bool, error) {
	keys, res := w.keys[:n], w.res[:n]
	for i := range res {
		res[i] = nil
	}
	var err error
	start := time.Now()
	switch op {
	case "put":
		for j := 0; j < n; j++ {
			stamp(w.vals[j], w.idx[j])
		}
		start = time.Now()
		err = w.c.put(keys, w.vals[:n], res)
	case "get":
		err = w.c.get(keys, w.bufs[:n], res)
	case "exist":
		err = w.c.exist(keys, res)
	}
	d := time.Since(start)
	if err == nil && op == "get" && verify {
		for j := 0; j < n; j++ {
			if res[j] == nil && !stamped(w.bufs[j], w.idx[j]) {
				res[j] = errCorrupt
			}
		}
	}
	return d, op == "put" || op == "get", err
}

// account adds a call's outcome to the worker's counters.
func (w *worker) account(n int, size int64, moves bool, err error) {
	w.calls++
	w.items += uint64(n)
	if err != nil {
		w.errs += uint64(n)
		if w.firstEr == nil {
			w.firstEr = err
		}
		return
	}
	for _, e := range w.res[:n] {
		switch {
		case e == nil:
			if moves {
				w.bytes += uint64(size)
			}
		case errors.Is(e, errMiss):
			w.misses++
		default:
			w.errs++
			if w.firstEr == nil {
				w.firstEr = e
			}
		}
	}
}

const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

func benchMain(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseFlags(args, stderr)
	if !ok {
		return code
	}
	t, err := openTarget(targetConfig{kind: o.target, members: o.members, addr: o.addr, ns: o.ns,
		conns: o.conns, batch: o.batch, ioTimeout: o.ioTimeout, getAuto: o.getAuto, blocking: o.blocking, bconc: o.bconc,
		poolSize: o.poolSize, file: o.file, verify: o.verify, transport: o.transport, rdmaProvider: o.rdmaProv, rdmaDev: o.rdmaDev,
		tlsCA: o.tlsCA, tlsCert: o.tlsCert, tlsKey: o.tlsKey, token: o.token}, int64(o.size))
	if err != nil {
		fmt.Fprintln(stderr, "dfkv_bench:", err)
		return exitSetup
	}
	defer t.close()
	// rawtcp carries no stamps; odirect checks its own (its reads land in aligned buffers).
	verify := o.verify && o.target != "rawtcp" && o.target != "odirect"
	workers := make([]*worker, o.conns)
	for i := range workers {
		c, err := t.newConn()
		if err != nil {
			fmt.Fprintf(stderr, "dfkv_bench: %s: connect: %v\n", t.name(), err)
			for _, w := range workers[:i] {
				w.c.close()
			}
			return exitSetup
		}
		workers[i] = newWorker(o, c, uint64(i+1)*0x2545f4914f6cdd1d)
		workers[i].t = t
	}
	defer func() {
		for _, w := range workers {
			w.c.close()
		}
	}()
	res := result{Label: o.label, Target: t.name(), Op: o.op, Size: int64(o.size), Conns: o.conns,
		Batch: o.batch, Keys: o.keys}

	if o.seed {
		start := time.Now()
		if err := seed(o, workers); err != nil {
			fmt.Fprintf(stderr, "dfkv_bench: seeding %d keys into %s: %v\n", o.keys, t.name(), err)
			return exitSetup
		}
		res.SeedSecs = time.Since(start).Seconds()
		fmt.Fprintf(stderr, "dfkv_bench: seeded %d keys of %d bytes into %s in %.2fs (%.3f GB/s)\n",
			o.keys, int64(o.size), t.name(), res.SeedSecs, float64(o.keys)*float64(o.size)/1e9/res.SeedSecs)
	}

	var phase atomic.Int32
	var issued atomic.Int64
	var next atomic.Uint64 // --distinct: the next key index
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func(w *worker) {
			defer wg.Done()
			w.loop(o, &phase, &issued, &next, verify)
		}(w)
	}
	if o.warmup > 0 {
		time.Sleep(o.warmup)
	}
	var prof *os.File
	if o.cpuprof != "" {
		if prof, err = os.Create(o.cpuprof); err == nil {
			err = pprof.StartCPUProfile(prof)
		}
		if err != nil {
			fmt.Fprintln(stderr, "dfkv_bench: cpuprofile:", err)
			phase.Store(phaseStop)
			wg.Wait()
			return exitSetup
		}
	}
	start := time.Now()
	phase.Store(phaseMeasure)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var stopAt <-chan time.Time
	if o.duration > 0 {
		tm := time.NewTimer(o.duration)
		defer tm.Stop()
		stopAt = tm.C
	}
	hard := time.NewTimer(o.maxTime)
	defer hard.Stop()
	select {
	case <-done:
	case <-stopAt:
		phase.Store(phaseStop)
		<-done
	case <-hard.C:
		res.TimedOut = true
		phase.Store(phaseStop)
		<-done
	}
	elapsed := time.Since(start)
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}

	var h hist
	for _, w := range workers {
		h.merge(&w.h)
		res.Items += w.items
		res.Calls += w.calls
		res.Bytes += w.bytes
		res.Errors += w.errs
		res.Misses += w.misses
		if w.firstEr != nil && res.FirstError == "" {
			res.FirstError = w.firstEr.Error()
		}
	}
	res.Seconds = elapsed.Seconds()
	if res.Seconds > 0 {
		res.OpsPerSec = float64(res.Items-res.Errors) / res.Seconds
		res.GBPerSec = float64(res.Bytes) / 1e9 / res.Seconds
	}
	res.Latency = latOf(&h)
	if c, ok := t.(interface{ check() error }); ok {
		// e.g. --transport rdma that ended up on TCP: the figures would be mislabeled.
		if err := c.check(); err != nil {
			fmt.Fprintln(stderr, "dfkv_bench:", err)
			return exitFail
		}
	}
	if o.jsonOut {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	} else {
		printHuman(stdout, &res)
	}
	if res.Errors > 0 || res.TimedOut || (o.strict && res.Misses > 0) {
		if res.FirstError != "" {
			fmt.Fprintln(stderr, "dfkv_bench: first error:", res.FirstError)
		}
		if res.TimedOut {
			fmt.Fprintf(stderr, "dfkv_bench: stopped at --max-time %v\n", o.maxTime)
		}
		return exitFail
	}
	return exitOK
}

func printHuman(w io.Writer, r *result) {
	fmt.Fprintf(w, "dfkv_bench: target=%s op=%s size=%s conns=%d batch=%d keys=%d time=%.2fs\n",
		r.Target, r.Op, sizeLabel(r.Size), r.Conns, r.Batch, r.Keys, r.Seconds)
	fmt.Fprintf(w, "  items=%d calls=%d errors=%d misses=%d  %.0f ops/s  %.3f GB/s\n",
		r.Items, r.Calls, r.Errors, r.Misses, r.OpsPerSec, r.GBPerSec)
	l := r.Latency
	fmt.Fprintf(w, "  latency/call: p50=%s p90=%s p99=%s p999=%s max=%s mean=%s\n",
		fmtUS(l.P50), fmtUS(l.P90), fmtUS(l.P99), fmtUS(l.P999), fmtUS(l.Max), fmtUS(l.Mean))
}

func fmtUS(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2fs", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.2fms", us/1e3)
	}
	return fmt.Sprintf("%.1fus", us)
}

// sizeLabel renders 1048576 as "1MiB" and 4096 as "4KiB" (exact multiples only).
func sizeLabel(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// loop is a worker's measurement loop: random keys, calls of --batch items, until the phase
// says stop or the --count budget is spent. Nothing here allocates.
func (w *worker) loop(o *options, phase *atomic.Int32, issued *atomic.Int64, next *atomic.Uint64, verify bool) {
	size := int64(o.size)
	for {
		ph := phase.Load()
		if ph == phaseStop {
			return
		}
		n := o.batch
		if ph == phaseMeasure && o.count > 0 {
			end := issued.Add(int64(n))
			if end-int64(n) >= o.count {
				return
			}
			n = int(min(int64(n), o.count-(end-int64(n))))
		}
		op := o.op
		if op == "mixed" {
			op = "put"
			if w.rng.Float64() < o.readRatio {
				op = "get"
			}
		}
		for j := 0; j < n; j++ {
			if o.distinct {
				w.setKey(j, o.keyBase+next.Add(1)-1)
			} else {
				w.setKey(j, w.rng.Uint64N(uint64(o.keys)))
			}
		}
		d, moves, err := w.call(op, n, verify)
		if err != nil && !w.redial() {
			err = fmt.Errorf("%w (and reconnecting failed: the worker stopped)", err)
			if ph == phaseMeasure {
				w.h.record(d)
				w.account(n, size, moves, err)
			} else if w.firstEr == nil {
				w.firstEr = err
			}
			return
		}
		if ph != phaseMeasure {
			if err != nil && ph == phaseWarmup && w.firstEr == nil {
				w.firstEr = err // reported if the measurement fails too
			}
			continue
		}
		w.h.record(d)
		w.account(n, size, moves, err)
	}
}

// redial replaces the worker's connection after a failed call, whose stream position is
// unknown (the dfkv client does this itself; its handle survives). False if it cannot.
func (w *worker) redial() bool {
	if w.t == nil || w.t.name() == "dfkv" {
		return true
	}
	w.c.close()
	c, err := w.t.newConn()
	if err != nil {
		w.c = nopConn{}
		return false
	}
	w.c = c
	return true
}

// nopConn stands in for a connection that could not be re-established.
type nopConn struct{}

var errNoConn = errors.New("no connection")

func (nopConn) put(_, _ [][]byte, _ []error) error { return errNoConn }
func (nopConn) get(_, _ [][]byte, _ []error) error { return errNoConn }
func (nopConn) exist(_ [][]byte, _ []error) error  { return errNoConn }
func (nopConn) close() error                       { return nil }

// seed PUTs every key once, the key space split in contiguous ranges across the workers.
func seed(o *options, workers []*worker) error {
	var wg sync.WaitGroup
	errs := make([]error, len(workers))
	per := (o.keys + len(workers) - 1) / len(workers)
	for wi, w := range workers {
		lo, hi := wi*per, min(o.keys, (wi+1)*per)
		if lo >= hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := lo; k < hi; k += o.batch {
				n := min(o.batch, hi-k)
				for j := 0; j < n; j++ {
					w.setKey(j, uint64(k+j))
				}
				_, _, err := w.call("put", n, false)
				if err == nil {
					for _, e := range w.res[:n] {
						if e != nil {
							err = e
							break
						}
					}
				}
				if err != nil {
					errs[wi] = fmt.Errorf("key %d: %w", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
