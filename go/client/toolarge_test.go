//go:build linux

package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/client"
)

// leaseNode (lease_test.go, a slab engine: Linux) serves 1 MiB values at most.
//
// A value over the node's advertised max value size (1 MiB here, under the client's own
// 64 MiB) or over the client's limit is ErrTooLarge, and still ErrInvalid as before; a value
// at the limit is stored, and an empty one is invalid but not too large.
func TestPutTooLarge(t *testing.T) {
	c, _ := leaseNode(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		n        int
		tooLarge bool
		invalid  bool
	}{
		{"first put, over the node's limit", 1<<20 + 1, true, true},
		{"at the node's limit", 1 << 20, false, false},
		{"over the client's limit", 64<<20 + 1, true, true},
		{"empty", 0, false, true},
	} {
		err := c.Put(ctx, []byte("big-"+tc.name), make([]byte, tc.n))
		if got := errors.Is(err, client.ErrTooLarge); got != tc.tooLarge {
			t.Errorf("%s: Put(%d bytes) = %v; ErrTooLarge %v, want %v", tc.name, tc.n, err, got, tc.tooLarge)
		}
		if got := errors.Is(err, client.ErrInvalid); got != tc.invalid {
			t.Errorf("%s: Put(%d bytes) = %v; ErrInvalid %v, want %v", tc.name, tc.n, err, got, tc.invalid)
		}
	}
}
