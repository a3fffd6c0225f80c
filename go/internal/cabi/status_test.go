package cabi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dfkv/dfkv/go/client"
)

func TestStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("dfkv: get n1: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, StatusOK},
		{"not found", wrap(client.ErrNotFound), StatusNotFound},
		{"unavailable", wrap(client.ErrUnavailable), StatusUnavailable},
		{"no compatible rail", wrap(client.ErrNoCompatibleRail), StatusUnavailable},
		{"timeout", wrap(client.ErrTimeout), StatusTimeout},
		{"context deadline", wrap(context.DeadlineExceeded), StatusTimeout},
		{"forbidden", wrap(client.ErrForbidden), StatusForbidden},
		// a too-large put wraps ErrTooLarge and ErrInvalid: the specific one wins
		{"too large", fmt.Errorf("put: %w: %w", client.ErrTooLarge, client.ErrInvalid), StatusTooLarge},
		{"too large, other order", fmt.Errorf("put: %w: %w", client.ErrInvalid, client.ErrTooLarge), StatusTooLarge},
		{"buffer too small", wrap(client.ErrBufferTooSmall), StatusBufferTooSmall},
		{"cache full", wrap(client.ErrCacheFull), StatusCacheFull},
		{"quota", wrap(client.ErrQuotaExceeded), StatusQuotaExceeded},
		{"busy", wrap(client.ErrBusy), StatusBusy},
		{"io", wrap(client.ErrIO), StatusIOError},
		{"invalid", wrap(client.ErrInvalid), StatusInvalid},
		{"empty value", errEmptyValue, StatusInvalid},
		{"empty buffer", errEmptyBuffer, StatusInvalid},
		{"array lengths", errArgs, StatusInvalid},
		{"closed", wrap(client.ErrClosed), StatusClosed},
		{"protocol", wrap(client.ErrProtocol), StatusProtocol},
		{"direct unsupported", wrap(client.ErrDirectUnsupported), StatusDirectUnsupported},
		// a device GET that cannot go direct says so, whatever transport cause it also wraps
		{"direct unsupported over unavailable", errors.Join(client.ErrUnavailable, client.ErrDirectUnsupported), StatusDirectUnsupported},
		// a server's answer beats the transport cause wrapped beside it
		{"forbidden over unavailable", errors.Join(client.ErrUnavailable, client.ErrForbidden), StatusForbidden},
		{"other", errors.New("something else"), StatusInternal},
	} {
		if got := Status(tc.err); got != tc.want {
			t.Errorf("%s: Status(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestStatusTooLargePut: the client's own refusal of an oversized value is TooLarge (and
// still ErrInvalid for callers that branched on that before ErrTooLarge existed).
func TestStatusTooLargePut(t *testing.T) {
	o := good() // nothing listens there: the size is refused before any routing
	id := Open(&o)
	defer Close(id)
	h := Lookup(id)
	if h == nil {
		t.Fatal(LastError())
	}
	_, err := h.Put([]byte("k"), make([]byte, 65<<20))
	if got := Status(err); got != StatusTooLarge {
		t.Fatalf("Status(%v) = %d, want StatusTooLarge", err, got)
	}
	if !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("%v does not wrap ErrInvalid", err)
	}
}
