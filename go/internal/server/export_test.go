package server

import (
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// AccessLoggerForTest returns a func that logs one typical GET record through a
// (connection-less) conn, as the serve loop does after each request.
func AccessLoggerForTest(a *AccessLog) func() {
	c := &conn{s: &Server{cfg: Config{AccessLog: a}}, peer: "127.0.0.1:40000"}
	req := &wire.Request{Op: fb.OpGet, Tenant: 0x735292dc2bf8eb8d, ID: identity.ObjectID{Hi: 1, Lo: 2}}
	return func() {
		c.acc = accessRecord{}
		c.acc.response(&wire.Response{Op: fb.OpGet, Status: fb.StatusOk, PayloadLen: 4096})
		c.noteAccess(req, 37*time.Microsecond, nil)
		c.logPending()
	}
}

// AccessLineForTest renders one record for req as the serve loop would, with the given
// peer, reply status, bytes sent and batch items.
func AccessLineForTest(a *AccessLog, req *wire.Request, peer string, st fb.Status, sent uint64, items, ok uint32, d time.Duration) {
	c := &conn{s: &Server{cfg: Config{AccessLog: a}}, peer: peer}
	c.acc = accessRecord{status: st, sent: sent, items: items, itemsOK: ok}
	c.noteAccess(req, d, nil)
	c.logPending()
}
