package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fb.Status
	}{
		{nil, fb.StatusOk},
		{fmt.Errorf("x: %w", store.ErrNotFound), fb.StatusNotFound},
		{store.ErrCorrupt, fb.StatusNotFound},
		{store.ErrCacheFull, fb.StatusCacheFull},
		// A write-back tier's full dirty budget: not stored, nothing lost, retry later.
		{fmt.Errorf("ramtier: budget: %w", store.ErrBusy), fb.StatusBusy},
		{store.ErrQuotaExceeded, fb.StatusQuotaExceeded},
		{store.ErrTooLarge, fb.StatusInvalid},
		{errors.New("disk on fire"), fb.StatusIOError},
	} {
		if got := statusOf(tc.err); got != tc.want {
			t.Errorf("statusOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
