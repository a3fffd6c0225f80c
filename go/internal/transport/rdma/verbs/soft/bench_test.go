package soft

import (
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// BenchmarkWrite measures a signaled 1 MiB RDMA WRITE between two soft devices (through the
// unix socket); BenchmarkMemcpy is the same bytes copied in memory, for the ratio.
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{4096, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			a, peer := pair(b, Options{}, nodeCfg{}, nodeCfg{})
			src := a.reg(size, verbs.AccessLocalWrite)
			dst := peer.reg(size, allRemote)
			b.SetBytes(int64(size))
			for i := 0; b.Loop(); i++ {
				a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
				if wc := poll(b, a.scq); wc.Status != verbs.StatusSuccess {
					b.Fatal(wc.Status)
				}
			}
		})
	}
}

func BenchmarkMemcpy(b *testing.B) {
	for _, size := range []int{4096, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return "1MiB"
	}
	return "4KiB"
}
