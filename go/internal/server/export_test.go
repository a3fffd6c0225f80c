package server

import (
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// LogAccessForTest writes one typical GET record through a (connection-less) conn.
func LogAccessForTest(a *AccessLog) {
	c := &conn{s: &Server{cfg: Config{AccessLog: a}}, peer: "127.0.0.1:40000"}
	c.acc.response(&wire.Response{Op: fb.OpGet, Status: fb.StatusOk, PayloadLen: 4096})
	c.access(&wire.Request{Op: fb.OpGet, Tenant: 0x735292dc2bf8eb8d, ID: identity.ObjectID{Hi: 1, Lo: 2}}, 37*time.Microsecond, nil)
}
