//go:build !linux

package soft

import (
	"fmt"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

func mapDMABuf(fd int, offset, size uint64) ([]byte, func(), error) {
	return nil, nil, fmt.Errorf("%w: soft: DMA-BUF stand-in needs Linux", verbs.ErrDMABufUnsupported)
}
