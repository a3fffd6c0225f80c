package slab

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// readAt and writeAt transfer all of b at off through the file-system seam.
func readAt(f vfs.File, b []byte, off int64) error {
	_, err := f.ReadAt(b, off)
	return err
}

func writeAt(f vfs.File, b []byte, off int64) error {
	_, err := f.WriteAt(b, off)
	return err
}

// ioErr classifies a device error: ENOSPC/EDQUOT are a full cache, the rest are I/O errors.
func ioErr(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", store.ErrCacheFull, err)
	}
	return fmt.Errorf("%w: %w", store.ErrIO, err)
}
