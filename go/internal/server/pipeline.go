package server

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// DefaultPutWindow is how many PUTs of one connection may have their device write in
// flight while the connection reads the requests behind them.
const DefaultPutWindow = 4

// pipeline overlaps a connection's PUTs with the requests that follow them: once a PUT's
// payload has been read off the socket, its engine write goes on in its own goroutine and
// the connection reads the next request. Replies stay in request order: a finished PUT
// writes its reply (and those of finished PUTs queued behind it) only when every earlier
// PUT has replied, and any other request waits until no PUT is in flight before it runs,
// so the reply buffer and socket writes belong to one goroutine at a time. The window
// bounds the in-flight PUTs (and so the engine buffers one connection pins).
type pipeline struct {
	mu      sync.Mutex
	cond    *sync.Cond
	window  int
	issued  uint64 // PUTs started
	replied uint64 // PUTs whose reply is written (in order)
	ready   map[uint64]*putJob
	broken  bool // a reply write failed: later replies are dropped, the connection closes
}

type putJob struct {
	seq   uint64
	req   wire.Request
	key   store.Key
	size  int
	start time.Time

	handoff chan error // from the writer goroutine: payload read (nil), or the read failed
	filled  bool       // fill ran (set before handoff, read after it)
	status  fb.Status
}

func (p *pipeline) init(window int) {
	p.window = window
	p.cond = sync.NewCond(&p.mu)
	p.ready = map[uint64]*putJob{}
}

// waitIdle returns once every started PUT has replied.
func (p *pipeline) waitIdle() {
	p.mu.Lock()
	for p.replied < p.issued {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

// ifIdle runs fn under the lock if no PUT is in flight (the reader may then use the reply
// buffer); otherwise the in-flight PUTs own it and fn does not run.
func (p *pipeline) ifIdle(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replied == p.issued {
		fn()
	}
}

// startPut reads a PUT's payload into the engine's buffer and leaves its device write in
// flight. It returns after the payload is off the socket (or the engine refused the value
// before reading it, in which case the payload is discarded here). A returned error
// closes the connection.
func (c *conn) startPut(r *wire.Request, start time.Time) error {
	p := &c.pipe
	p.mu.Lock()
	for p.issued-p.replied >= uint64(p.window) {
		p.cond.Wait()
	}
	p.issued++
	j := &putJob{seq: p.issued, req: *r, key: store.Key{ID: r.ID, Tenant: r.Tenant}, size: int(r.PayloadLen),
		start: start, handoff: make(chan error, 1)}
	p.mu.Unlock()

	go func() {
		handed := false
		err := c.s.cfg.Engine.Put(j.key, j.size, func(dst []byte) error {
			j.filled = true
			_, rerr := io.ReadFull(c.br, dst)
			handed = true
			if rerr != nil {
				j.handoff <- errConn{rerr}
				return errConn{rerr}
			}
			j.handoff <- nil
			return nil
		})
		if !handed {
			j.handoff <- nil // refused before reading: the payload is still on the wire
		}
		j.status = statusOf(err)
		if j.filled {
			c.s.cfg.Hot.wrote(j.key) // before the reply: replicas of the old bytes are gone
		}
		if err == nil {
			c.s.m.BytesIn.Add(float64(j.size))
		} else if j.status == fb.StatusIOError && !isConnErr(err) {
			c.s.log.Warn("put failed", "id", j.key.ID, "size", j.size, "err", err)
		}
		c.finishPut(j, isConnErr(err))
	}()

	if err := <-j.handoff; err != nil {
		return err
	}
	if !j.filled {
		return c.discard(r.PayloadLen)
	}
	return nil
}

func isConnErr(err error) bool {
	var ce errConn
	return errors.As(err, &ce)
}

// finishPut records a finished PUT and writes, in request order, every reply that is now
// due. The goroutine whose PUT completes the run of due replies does the socket write.
func (c *conn) finishPut(j *putJob, connErr bool) {
	p := &c.pipe
	p.mu.Lock()
	defer p.mu.Unlock()
	if connErr {
		p.broken = true // the payload read failed: the reader is closing the connection
	}
	p.ready[j.seq] = j
	wrote := false
	for {
		d := p.ready[p.replied+1]
		if d == nil {
			break
		}
		delete(p.ready, d.seq)
		p.replied++
		if p.broken {
			continue
		}
		c.s.m.request(d.req.Op, d.status)
		c.acc = accessRecord{}
		c.replyStatus(d.req.Op, d.status, 0)
		dur := time.Since(d.start)
		c.s.m.observe(d.req.Op, dur.Seconds())
		if c.s.cfg.AccessLog != nil {
			c.noteAccess(&d.req, dur, nil)
			c.logPending()
		}
		wrote = true
	}
	if wrote && !p.broken {
		if err := c.flush(); err != nil {
			p.broken = true
			_ = c.nc.SetReadDeadline(time.Now()) // wake the reader: the connection is dead
		}
	}
	p.cond.Broadcast()
}
