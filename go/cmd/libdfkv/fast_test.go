//go:build cgo

package main

import (
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// The C side serves a client only if it writes the request probe and reads the reply probe
// exactly as the generated code does: a change of any request byte is refused, and so is
// one in any reply field it reads (count and reserved are the fields it does not read).
func TestFastRegisterChecksTheLayout(t *testing.T) {
	if why := fastUnavailable(); why != "" {
		t.Fatalf("the fast path is unavailable here: %s", why)
	}
	info := client.DetachedInfo{Tenant: 0xfeedface, Namespace: []byte("ns\x00x"), IOTimeout: time.Second, PoolSize: 4}
	id := uint64(0x7fff0000)
	register := func(req, resp []byte) int {
		id++
		rc := fastRegister(id, info, req, resp)
		fastClose(id)
		return rc
	}
	req, resp := fastProbes(info.Tenant)
	if rc := register(req[:], resp[:]); rc != 0 {
		t.Fatalf("the generated probes refused: %d", rc)
	}
	for i := range req {
		bad := req
		bad[i] ^= 0x40
		if rc := register(bad[:], resp[:]); rc != -3 {
			t.Errorf("request byte %d changed: register = %d, want -3", i, rc)
		}
	}
	for i := range resp {
		bad := resp
		bad[i] ^= 0x40
		want := -4
		if i >= 8 && i < 16 {
			want = 0 // count, reserved: not read
		}
		if rc := register(req[:], bad[:]); rc != want {
			t.Errorf("reply byte %d changed: register = %d, want %d", i, rc, want)
		}
	}
}
