package secure

import (
	"crypto/aes"
	"crypto/cipher"
	"testing"
)

// BenchmarkAESGCMSeal16KiB is TLS 1.3's record cipher on a full 16 KiB record, one core:
// the floor under the CPU a TLS GET costs (docs/BENCHMARKS.md, "Why 0.6× is out of reach").
//
//	go test -run '^$' -bench AESGCMSeal -benchtime 2s ./go/internal/secure
func BenchmarkAESGCMSeal16KiB(b *testing.B) {
	block, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		b.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		b.Fatal(err)
	}
	nonce, plain := make([]byte, gcm.NonceSize()), make([]byte, 16<<10)
	out := make([]byte, 0, len(plain)+gcm.Overhead())
	b.SetBytes(int64(len(plain)))
	for b.Loop() {
		out = gcm.Seal(out[:0], nonce, plain, nil)
	}
}
