package onesided

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Native notifications on an RDMA connection (docs/RDMA.md, "Notifications"): the control
// messages of a connection after its bootstrap go over a notification QP of its own, not
// over the bootstrap TCP connection:
//
//	dfkv.drain  server → client: the server is going away (drain or close); the client
//	            stops posting on the connection (Client.Draining) and opens a fresh one.
//	dfkv.bye    client → server: the client is closing the connection; the server ends the
//	            session without waiting for the TCP connection to close.
//	dfkv.rail   server → client: a rail changed health (RailServer.RailEvent); body
//	            "<device> <state>".
//
// Anything else is the application's (Client.Notify, Server.Broadcast), delivered to
// NotifyConfig.Handler. The TCP connection carries a notification (frame kind 3) only when
// the peer has no notification QP or the message is larger than it accepts, and only when
// NotifyConfig.OOBFallback is set.
const (
	NotifyDrain = "dfkv.drain"
	NotifyBye   = "dfkv.bye"
	NotifyRail  = "dfkv.rail"
)

// NotifyConfig configures native notifications.
type NotifyConfig struct {
	// Enabled: a client offers a notification QP; a server answers one when offered. A
	// peer without it (or whose answer has none) is a peer without native notifications.
	Enabled bool
	// OOBFallback: a notification the peer cannot take natively goes over the bootstrap
	// TCP connection instead; unset, it fails (notify.ErrUnsupported / ErrTooLarge).
	OOBFallback bool
	// Endpoint shapes each connection's notification QP (credits, send depth, largest
	// message, bounded waits); its Handler is set by the connection. Zero fields take the
	// connection defaults (endpointDefaults), smaller than the notify package's: a server
	// has a QP per connection and dfkv's own notices are a few bytes.
	Endpoint notify.Config
	// Hub bounds the device's shared notification CQs and registered buffers (the first
	// connection on a device sets them).
	Hub notify.HubConfig
	// Handler receives notifications other than dfkv's own. It runs on the device's
	// notification poller (or the TCP reader): it must not block.
	Handler notify.Handler
}

// endpointDefaults: 8 credits, 8 sends in flight, 4 KiB buffers: 20 buffers, 80 KiB
// registered per connection (larger notifications take the TCP fallback where allowed).
func endpointDefaults(c notify.Config) notify.Config {
	if c.Credits == 0 {
		c.Credits = 8
	}
	if c.SendDepth == 0 {
		c.SendDepth = 8
	}
	if c.MaxMsg == 0 {
		c.MaxMsg = 4096 - notify.HeaderSize
	}
	return c
}

// frameNotify carries a notification on the bootstrap TCP connection (the fallback).
const frameNotify = 3

// oob writes notifications on a bootstrap connection, one at a time.
type oob struct {
	mu      sync.Mutex
	conn    net.Conn
	timeout time.Duration
}

func (o *oob) send(name string, body []byte) error {
	f, err := notify.AppendFrame(nil, name, body)
	if err != nil {
		return err
	}
	if len(f) > maxFrame {
		return fmt.Errorf("%w: %d bytes over TCP (max %d)", notify.ErrTooLarge, len(f), maxFrame)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return writeFrame(o.conn, frameNotify, f, o.timeout)
}

// readNotifyFrames reads notification frames from boot until it closes, fails or carries
// anything else, handing each to h. It has no deadline: it is a liveness watch.
func readNotifyFrames(boot net.Conn, h func(name string, body []byte)) error {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(boot, hdr[:]); err != nil {
			return err
		}
		n := binary.LittleEndian.Uint32(hdr[1:])
		if hdr[0] != frameNotify || n > maxFrame {
			return fmt.Errorf("onesided: frame kind %d of %d bytes after the bootstrap", hdr[0], n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(boot, b); err != nil {
			return err
		}
		name, body, err := notify.DecodeFrame(b)
		if err != nil {
			return err
		}
		h(name, body)
	}
}

// notifyHub returns the device's notification hub, made on first use.
func (d *Device) notifyHub(cfg notify.HubConfig) *notify.Hub {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hub == nil {
		cfg.Port, cfg.Metrics = d.port, &d.m.Notify
		d.hub = notify.NewHub(d.ctx, d.pd, cfg)
	}
	return d.hub
}

// offerNotify acquires the connection's notification endpoint (client); nil when disabled
// or the device's notification capacity is exhausted (the connection works without).
func (c *Client) offerNotify(offer *dcp.Tail) {
	nc := c.cfg.Notify
	if !nc.Enabled {
		return
	}
	ec := endpointDefaults(nc.Endpoint)
	ec.Handler = c.onNotify
	ep, err := c.dev.notifyHub(nc.Hub).Acquire(ec)
	if err != nil {
		c.cfg.Logger.Debug("rdma: no notification endpoint; the connection goes without", "err", err)
		return
	}
	c.nep = ep
	info := ep.Info()
	offer.Notify = &info
}

// answerNotify connects the endpoint to the server's (or lets it go when the server has
// none) and sets up the paths, and starts the bootstrap connection's reader.
func (c *Client) answerNotify(ans dcp.Tail) error {
	if c.nep != nil {
		if ans.Notify == nil {
			c.nep.Release()
			c.nep = nil
		} else if err := c.nep.Connect(*ans.Notify, ans.Rails[0], c.path); err != nil {
			return err
		}
	}
	nc := c.cfg.Notify
	c.oob = &oob{conn: c.boot, timeout: c.cfg.IOTimeout}
	c.notifier = &notify.Sender{EP: c.nep, Fallback: c.oob.send, AllowFallback: nc.OOBFallback, M: &c.M.Notify}
	// The bootstrap connection is always read: notification frames when the fallback is on,
	// and its end, which is how a dead server shows itself at once (Do fails with
	// ErrPeerClosed instead of waiting out the I/O timeout).
	if c.boot == nil { // a test's connection without a bootstrap stream
		return nil
	}
	c.readerDone = make(chan struct{})
	dev, boot := c.ctx.Info().Name, c.boot
	go func() {
		defer close(c.readerDone)
		err := readNotifyFrames(boot, c.onNotify)
		c.peerClosed.Store(true)
		c.cfg.Logger.Debug("rdma: bootstrap connection ended", "device", dev, "err", err)
	}()
	return nil
}

func (c *Client) onNotify(name string, body []byte) {
	switch name {
	case NotifyDrain:
		c.draining.Store(true)
	default:
		if h := c.cfg.Notify.Handler; h != nil {
			h(name, body)
		}
	}
}

// PeerClosed reports whether the server closed the bootstrap connection: the connection
// is dead and should take no work.
func (c *Client) PeerClosed() bool { return c.peerClosed.Load() }

// Draining reports whether the server said it is going away (dfkv.drain): the connection
// should take no new work.
func (c *Client) Draining() bool { return c.draining.Load() }

// Notify sends an application notification to the server: natively when the connection
// has a notification QP and the message fits, else over the bootstrap TCP connection when
// NotifyConfig.OOBFallback allows. nil means submitted (native) or written (TCP), not
// received. Safe to call concurrently with Do.
func (c *Client) Notify(ctx context.Context, name string, body []byte) error {
	if c.notifier == nil {
		return fmt.Errorf("onesided: notify on a connection without notifications: %w", notify.ErrUnsupported)
	}
	return c.notifier.Send(ctx, name, body)
}

// closeNotify says goodbye natively (bounded; the TCP close says it anyway) and gives the
// endpoint back to the device's idle list.
func (c *Client) closeNotify() {
	if c.nep == nil {
		return
	}
	if !c.draining.Load() { // a draining server has ended the session already
		// Short bounds: the TCP close that follows says the same thing.
		ctx, cancel := context.WithTimeout(context.Background(), min(c.cfg.IOTimeout, 200*time.Millisecond))
		if c.nep.Send(ctx, NotifyBye, nil) == nil {
			c.nep.Flush(ctx) // a teardown would flush the SEND before it left
		}
		cancel()
	}
	c.nep.Release()
}

// serverNotify is a server connection's notification side.
type serverNotify struct {
	ep     *notify.Endpoint
	sender *notify.Sender
	bye    chan struct{}
	once   sync.Once
}

// acceptNotify makes the server side of a connection's notifications and fills the answer.
func (s *Server) acceptNotify(boot net.Conn, offer dcp.Tail, ans *dcp.Tail, path verbs.Path) (*serverNotify, error) {
	sn := &serverNotify{bye: make(chan struct{})}
	nc := s.cfg.Notify
	handler := func(name string, body []byte) {
		switch name {
		case NotifyBye:
			sn.once.Do(func() { close(sn.bye) })
		default:
			if nc.Handler != nil {
				nc.Handler(name, body)
			}
		}
	}
	if offer.Notify != nil && s.hub != nil {
		ec := endpointDefaults(nc.Endpoint)
		ec.Handler = handler
		ep, err := s.hub.Acquire(ec)
		if err != nil {
			s.cfg.Logger.Debug("rdma: no notification endpoint for a connection", "err", err)
		} else if err := ep.Connect(*offer.Notify, offer.Rails[0], path); err != nil {
			ep.Close()
			return nil, err
		} else {
			sn.ep = ep
			info := ep.Info()
			ans.Notify = &info
		}
	}
	o := &oob{conn: boot, timeout: s.cfg.IOTimeout}
	sn.sender = &notify.Sender{EP: sn.ep, Fallback: o.send, AllowFallback: nc.OOBFallback, M: &s.M.Notify}
	return sn, nil
}

// deliver hands a notification that came over TCP to the same handler.
func (sn *serverNotify) deliver(h notify.Handler) func(name string, body []byte) {
	return func(name string, body []byte) {
		if name == NotifyBye {
			sn.once.Do(func() { close(sn.bye) })
			return
		}
		if h != nil {
			h(name, body)
		}
	}
}

// end tells the client the server is going away when it is (not when the client left),
// then gives the endpoint back.
func (sn *serverNotify) end(s *Server, serverGone bool) {
	if serverGone && (sn.ep != nil || sn.sender.AllowFallback) {
		ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.IOTimeout, time.Second))
		if err := sn.sender.Send(ctx, NotifyDrain, nil); err != nil {
			s.cfg.Logger.Info("rdma: drain notice not sent", "err", err)
		} else if sn.ep != nil {
			sn.ep.Flush(ctx)
		}
		cancel()
	}
	if sn.ep != nil {
		sn.ep.Release()
	}
}

// gone reports whether the server side is ending the session (drain, Close), as opposed to
// the client leaving.
func (s *Server) gone(ctx context.Context) bool {
	select {
	case <-s.stop:
		return true
	default:
		return ctx.Err() != nil
	}
}

func (s *Server) track(sn *serverNotify, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		s.notifiers[sn] = struct{}{}
	} else {
		delete(s.notifiers, sn)
	}
}

// Broadcast sends a notification to every live connection (natively, or over TCP where the
// fallback allows); it returns how many took it and the first error.
func (s *Server) Broadcast(ctx context.Context, name string, body []byte) (sent int, err error) {
	s.mu.Lock()
	sns := make([]*serverNotify, 0, len(s.notifiers))
	for sn := range s.notifiers {
		sns = append(sns, sn)
	}
	s.mu.Unlock()
	for _, sn := range sns {
		if e := sn.sender.Send(ctx, name, body); e != nil {
			err = cmp.Or(err, e)
			continue
		}
		sent++
	}
	return sent, err
}

// Broadcast sends a notification to every connection of every served rail.
func (r *RailServer) Broadcast(ctx context.Context, name string, body []byte) (sent int, err error) {
	_, ss := r.served()
	for _, s := range ss {
		n, e := s.Broadcast(ctx, name, body)
		sent += n
		err = cmp.Or(err, e)
	}
	return sent, err
}

// RailEventBody is a dfkv.rail notification's body: "<device> <health> <generation>".
func RailEventBody(device, health string, generation uint32) []byte {
	return fmt.Appendf(nil, "%s %s %d", device, health, generation)
}

// ParseRailEvent reads a dfkv.rail body (RailEventBody); anything else is an error.
func ParseRailEvent(body []byte) (device, health string, generation uint32, err error) {
	f := strings.Fields(string(body))
	if len(f) != 3 || len(body) > 256 {
		return "", "", 0, fmt.Errorf("onesided: dfkv.rail body %q: want \"<device> <health> <generation>\"", body)
	}
	g, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return "", "", 0, fmt.Errorf("onesided: dfkv.rail body %q: generation: %w", body, err)
	}
	return f[0], f[1], uint32(g), nil
}
