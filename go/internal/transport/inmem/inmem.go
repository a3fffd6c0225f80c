package inmem

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport"
)

// ErrUnreachable is returned by a dial to an address with no listener or behind a partition.
var ErrUnreachable = fmt.Errorf("inmem: unreachable: %w", syscall.ECONNREFUSED)

// Network is a set of in-memory listeners and the faults applied to their traffic.
type Network struct {
	mu        sync.Mutex
	listeners map[string]*Listener
	faults    map[string]*fault // by listener address
	conns     map[string]map[*Conn]struct{}
	next      int
}

type fault struct {
	partitioned bool
	blackhole   bool
	delay       time.Duration
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{listeners: map[string]*Listener{}, faults: map[string]*fault{}, conns: map[string]map[*Conn]struct{}{}}
}

// Listen opens a listener on addr; "" picks a fresh "inmem-N" address.
func (n *Network) Listen(addr string) (*Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr == "" {
		n.next++
		addr = fmt.Sprintf("inmem-%d:1", n.next)
	}
	if _, ok := n.listeners[addr]; ok {
		return nil, fmt.Errorf("inmem: listen %s: %w", addr, syscall.EADDRINUSE)
	}
	l := &Listener{n: n, addr: addr, accept: make(chan *Conn, 64), done: make(chan struct{})}
	n.listeners[addr] = l
	return l, nil
}

func (n *Network) faultOf(addr string) *fault {
	f := n.faults[addr]
	if f == nil {
		f = &fault{}
		n.faults[addr] = f
	}
	return f
}

// Partition cuts addr off: dials fail with ErrUnreachable and open connections break.
func (n *Network) Partition(addr string) {
	n.mu.Lock()
	n.faultOf(addr).partitioned = true
	conns := n.conns[addr]
	delete(n.conns, addr)
	n.mu.Unlock()
	for c := range conns {
		c.breakBoth()
	}
}

// Blackhole makes addr swallow traffic: dials succeed, writes to it are discarded and
// nothing ever comes back, as with a peer that hangs or a network that drops packets.
// Only the caller's deadlines end such a wait.
func (n *Network) Blackhole(addr string) {
	n.mu.Lock()
	n.faultOf(addr).blackhole = true
	for c := range n.conns[addr] {
		c.tx.setBlackhole(true)
	}
	n.mu.Unlock()
}

// Delay adds d before every write on connections to or from addr is delivered.
func (n *Network) Delay(addr string, d time.Duration) {
	n.mu.Lock()
	n.faultOf(addr).delay = d
	for c := range n.conns[addr] {
		c.setDelay(d)
		c.peer.setDelay(d)
	}
	n.mu.Unlock()
}

// Heal removes every fault on addr (connections a partition broke stay broken).
func (n *Network) Heal(addr string) {
	n.mu.Lock()
	delete(n.faults, addr)
	for c := range n.conns[addr] {
		c.tx.setBlackhole(false)
		c.setDelay(0)
		c.peer.setDelay(0)
	}
	n.mu.Unlock()
}

// Dialer returns a transport.Dialer over this network (Mode "inmem").
func (n *Network) Dialer() transport.Dialer { return dialer{n} }

type dialer struct{ n *Network }

func (d dialer) Mode() string { return "inmem" }

func (d dialer) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	n := d.n
	n.mu.Lock()
	l := n.listeners[addr]
	f := n.faults[addr]
	if l == nil || (f != nil && f.partitioned) {
		n.mu.Unlock()
		return nil, &net.OpError{Op: "dial", Net: "inmem", Err: ErrUnreachable}
	}
	client, server := newPair(addrOf("client"), addrOf(addr))
	if f != nil {
		client.tx.blackhole = f.blackhole
		client.delay, server.delay = f.delay, f.delay
	}
	if n.conns[addr] == nil {
		n.conns[addr] = map[*Conn]struct{}{}
	}
	n.conns[addr][client] = struct{}{}
	client.onClose = func() {
		n.mu.Lock()
		delete(n.conns[addr], client)
		n.mu.Unlock()
	}
	n.mu.Unlock()
	select {
	case l.accept <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
		client.Close()
		return nil, &net.OpError{Op: "dial", Net: "inmem", Err: ctx.Err()}
	}
	client.Close()
	return nil, &net.OpError{Op: "dial", Net: "inmem", Err: ErrUnreachable}
}

// Listener is an in-memory transport.Listener.
type Listener struct {
	n      *Network
	addr   string
	accept chan *Conn
	done   chan struct{}
	once   sync.Once
}

var _ transport.Listener = (*Listener)(nil)

// Accept waits for the next dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; established connections stay open.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.n.mu.Lock()
		if l.n.listeners[l.addr] == l {
			delete(l.n.listeners, l.addr)
		}
		l.n.mu.Unlock()
	})
	return nil
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return addrOf(l.addr) }

type addrOf string

func (a addrOf) Network() string { return "inmem" }
func (a addrOf) String() string  { return string(a) }

// pipe is one direction of a connection: an unbounded byte queue.
type pipe struct {
	mu        sync.Mutex
	buf       []byte
	closed    bool          // the writer closed: reads drain, then io.EOF
	broken    bool          // cut (partition, reader closed): reads and writes fail now
	blackhole bool          // writes are discarded
	changed   chan struct{} // closed and replaced on every state change
}

func newPipe() *pipe { return &pipe{changed: make(chan struct{})} }

func (p *pipe) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *pipe) setBlackhole(v bool) {
	p.mu.Lock()
	p.blackhole = v
	p.mu.Unlock()
}

func (p *pipe) write(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken || p.closed {
		return net.ErrClosed
	}
	if !p.blackhole {
		p.buf = append(p.buf, b...)
		p.notifyLocked()
	}
	return nil
}

func (p *pipe) shut(broken bool) {
	p.mu.Lock()
	p.closed = true
	p.broken = p.broken || broken
	p.notifyLocked()
	p.mu.Unlock()
}

// Conn is one end of an in-memory connection.
type Conn struct {
	rx, tx       *pipe
	local, peerA net.Addr
	peer         *Conn

	mu            sync.Mutex
	readDeadline  time.Time
	writeDeadline time.Time
	delay         time.Duration
	dlChanged     chan struct{}
	closeOnce     sync.Once
	onClose       func() // forgets the connection in its Network
}

var _ net.Conn = (*Conn)(nil)

func newPair(clientAddr, serverAddr net.Addr) (*Conn, *Conn) {
	a, b := newPipe(), newPipe()
	c := &Conn{rx: a, tx: b, local: clientAddr, peerA: serverAddr, dlChanged: make(chan struct{})}
	s := &Conn{rx: b, tx: a, local: serverAddr, peerA: clientAddr, dlChanged: make(chan struct{})}
	c.peer, s.peer = s, c
	return c, s
}

func (c *Conn) setDelay(d time.Duration) {
	c.mu.Lock()
	c.delay = d
	c.mu.Unlock()
}

// Read reads what the peer wrote, waiting until data, EOF, a break or the read deadline.
func (c *Conn) Read(b []byte) (int, error) {
	for {
		c.rx.mu.Lock()
		if c.rx.broken {
			c.rx.mu.Unlock()
			return 0, net.ErrClosed
		}
		if len(c.rx.buf) > 0 {
			n := copy(b, c.rx.buf)
			c.rx.buf = c.rx.buf[n:]
			c.rx.mu.Unlock()
			return n, nil
		}
		if c.rx.closed {
			c.rx.mu.Unlock()
			return 0, io.EOF
		}
		changed := c.rx.changed
		c.rx.mu.Unlock()
		if err := c.wait(changed, true); err != nil {
			return 0, err
		}
	}
}

// wait blocks until ch closes, the deadline passes or the deadline changes.
func (c *Conn) wait(ch <-chan struct{}, read bool) error {
	c.mu.Lock()
	dl := c.writeDeadline
	if read {
		dl = c.readDeadline
	}
	dlChanged := c.dlChanged
	c.mu.Unlock()
	var timer <-chan time.Time
	if !dl.IsZero() {
		d := time.Until(dl)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ch:
	case <-dlChanged:
	case <-timer:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Write queues b for the peer (after the network's delay, if any).
func (c *Conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	d, dl := c.delay, c.writeDeadline
	c.mu.Unlock()
	if !dl.IsZero() && !time.Now().Before(dl) {
		return 0, os.ErrDeadlineExceeded
	}
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		var deadline <-chan time.Time
		if !dl.IsZero() {
			dt := time.NewTimer(time.Until(dl))
			defer dt.Stop()
			deadline = dt.C
		}
		select {
		case <-t.C:
		case <-deadline:
			return 0, os.ErrDeadlineExceeded
		}
	}
	if err := c.tx.write(b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Close ends both directions: the peer reads EOF after what was already written.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.tx.shut(false)
		c.rx.shut(true)
		if c.onClose != nil {
			c.onClose()
		}
	})
	return nil
}

// breakBoth cuts the connection at once in both directions (a partition).
func (c *Conn) breakBoth() {
	c.tx.mu.Lock()
	c.tx.buf = nil
	c.tx.mu.Unlock()
	c.rx.mu.Lock()
	c.rx.buf = nil
	c.rx.mu.Unlock()
	c.tx.shut(true)
	c.rx.shut(true)
}

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.peerA }

func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline, c.writeDeadline = t, t
	close(c.dlChanged)
	c.dlChanged = make(chan struct{})
	c.mu.Unlock()
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	close(c.dlChanged)
	c.dlChanged = make(chan struct{})
	c.mu.Unlock()
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDeadline = t
	close(c.dlChanged)
	c.dlChanged = make(chan struct{})
	c.mu.Unlock()
	return nil
}
