package server

import (
	"bufio"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// AccessLog writes one JSON record per sampled request: op, tenant, key hash, sizes,
// status, latency and peer. The server only ever sees a key's 128-bit SHA-256 object id,
// so the raw key cannot reach the log.
//
// A record is the line slog.NewJSONHandler would write for the same attributes (a test
// holds the two equal), rendered by a dedicated appender instead of going through
// slog.Record and the handler: at full sampling the generic path cost several times more
// per request (Attr copies, a heap-allocated attribute slice, reflection-free but
// kind-switching rendering), which is what made the 5% budget unreachable on small GETs.
//
// Records go through a buffered writer flushed every AccessLogFlushEvery (and on Close), so full
// sampling costs a formatted record and a memcpy per request, not a write(2).
type AccessLog struct {
	every uint64
	bw    *syncBuffer
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// AccessLogFlushEvery bounds how long a record may sit in the buffer.
const AccessLogFlushEvery = 200 * time.Millisecond

// NewAccessLog logs every sampleEvery-th request of each connection (1 = every request) to w.
func NewAccessLog(w io.Writer, sampleEvery int) (*AccessLog, error) {
	if sampleEvery < 1 {
		return nil, errors.New("access log: sample rate must be at least 1 (log 1 in N requests)")
	}
	bw := &syncBuffer{w: bufio.NewWriterSize(w, 256<<10)}
	a := &AccessLog{
		every: uint64(sampleEvery),
		bw:    bw,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go a.flusher()
	return a, nil
}

func (a *AccessLog) flusher() {
	defer close(a.done)
	t := time.NewTicker(AccessLogFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			_ = a.bw.Flush()
		}
	}
}

// Close flushes what is buffered and stops the flusher; records logged afterwards (a
// connection still finishing) are written through unbuffered. The writer is not closed.
func (a *AccessLog) Close() error {
	a.once.Do(func() { close(a.stop); <-a.done })
	return a.bw.closeBuffer()
}

// syncBuffer serialises the handler's writes with the flusher's.
type syncBuffer struct {
	mu     sync.Mutex
	w      *bufio.Writer
	closed bool
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.w.Write(p)
	if err == nil && b.closed {
		err = b.w.Flush()
	}
	return n, err
}

func (b *syncBuffer) closeBuffer() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return b.w.Flush()
}

func (b *syncBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w.Flush()
}

// accessRecord is what a connection notes about the request it is serving; the reply
// assembly fills it so that the hook needs no change in the op handlers.
type accessRecord struct {
	pending bool
	req     wire.Request
	d       time.Duration
	err     error
	status  fb.Status
	sent    uint64
	items   uint32
	itemsOK uint32
}

func (r *accessRecord) response(resp *wire.Response) {
	r.status = resp.Status
	r.sent += resp.PayloadLen
}

func (r *accessRecord) result(res *wire.BatchResult) {
	r.items++
	if res.Status == fb.StatusOk {
		r.itemsOK++
	}
	r.sent += res.PayloadLen
}

// noteAccess keeps the request just served for the log when it falls in the sample;
// connErr is the error that is closing the connection, if any. The record is written by
// logPending once the reply has been flushed.
func (c *conn) noteAccess(req *wire.Request, d time.Duration, connErr error) {
	c.accessN++
	if (c.accessN-1)%c.s.cfg.AccessLog.every != 0 {
		return
	}
	c.acc.pending, c.acc.req, c.acc.d, c.acc.err = true, *req, d, connErr
}

func (c *conn) logPending() {
	if !c.acc.pending {
		return
	}
	c.acc.pending = false
	c.access(&c.acc.req, c.acc.d, c.acc.err)
}

func (c *conn) access(req *wire.Request, d time.Duration, connErr error) {
	a := c.s.cfg.AccessLog
	if c.peer == "" {
		c.peer = c.nc.RemoteAddr().String()
	}
	// A connection usually carries one tenant: format its hash once.
	if c.tenantStr == "" || c.tenantFor != req.Tenant {
		c.tenantFor, c.tenantStr = req.Tenant, strconv.FormatUint(req.Tenant, 16)
	}
	status := statusName(c.acc.status)
	if connErr != nil {
		status = "ConnectionClosed"
	}
	bp := lineBufs.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, `{"time":"`...)
	b = c.appendTime(b, time.Now())
	b = append(b, `","level":"INFO","msg":"access","op":"`...)
	b = append(b, opName(req.Op)...)
	b = append(b, `","tenant":"`...)
	b = append(b, c.tenantStr...)
	b = append(b, `","key_hash":"`...)
	b = append(b, keyHash(&c.keyHex, req)...)
	b = append(b, `","size":`...)
	b = strconv.AppendUint(b, req.PayloadLen, 10)
	b = append(b, `,"sent":`...)
	b = strconv.AppendUint(b, c.acc.sent, 10)
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","latency_us":`...)
	b = strconv.AppendInt(b, d.Microseconds(), 10)
	b = append(b, `,"peer":`...)
	b = appendJSONString(b, c.peer)
	if c.acc.items > 0 {
		b = append(b, `,"items":`...)
		b = strconv.AppendUint(b, uint64(c.acc.items), 10)
		b = append(b, `,"items_ok":`...)
		b = strconv.AppendUint(b, uint64(c.acc.itemsOK), 10)
	}
	b = append(b, '}', '\n')
	_, _ = a.bw.Write(b)
	*bp = b
	lineBufs.Put(bp)
}

// keyHash formats the request's object id (already a SHA-256 prefix of the key) as hex
// into the connection's buffer; batch requests carry their ids in the items, so they log
// none here. The string aliases buf: it is valid until the next record of the connection,
// which is enough because the handler renders the record before returning.
func keyHash(buf *[32]byte, req *wire.Request) string {
	if req.ID.IsZero() {
		return ""
	}
	const hexd = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		buf[15-i] = hexd[(req.ID.Hi>>(4*i))&0xf]
		buf[31-i] = hexd[(req.ID.Lo>>(4*i))&0xf]
	}
	return unsafe.String(&buf[0], len(buf))
}

// appendTime appends t in UTC as RFC 3339 with nanoseconds (2006-01-02T15:04:05.000000000Z),
// formatting the date and clock once per second per connection.
func (c *conn) appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	if sec := t.Unix(); sec != c.tsSec || len(c.tsPrefix) == 0 {
		c.tsSec = sec
		c.tsPrefix = t.Truncate(time.Second).AppendFormat(c.tsPrefix[:0], "2006-01-02T15:04:05.")
	}
	b = append(b, c.tsPrefix...)
	ns := t.Nanosecond()
	var d [9]byte
	for i := 8; i >= 0; i-- {
		d[i] = byte('0' + ns%10)
		ns /= 10
	}
	b = append(b, d[:]...)
	return append(b, 'Z')
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
