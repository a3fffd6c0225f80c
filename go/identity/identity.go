package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// ObjectID is the first 128 bits of SHA-256 over the length-framed namespace and key.
// Hi holds digest bytes 0..7 and Lo bytes 8..15, each read big-endian, so that
// fmt.Sprintf("%016x%016x", Hi, Lo) equals the hex digest prefix.
type ObjectID struct {
	Hi, Lo uint64
}

// String formats the id as 32 lowercase hex digits.
func (id ObjectID) String() string { return fmt.Sprintf("%016x%016x", id.Hi, id.Lo) }

// IsZero reports whether the id is the zero value (never produced by Object).
func (id ObjectID) IsZero() bool { return id.Hi == 0 && id.Lo == 0 }

// tenantDomain separates tenant hashes from every other SHA-256 use.
const tenantDomain = "DFKVTENANT1"

// Object returns the object id of key within namespace. Both may hold any bytes,
// including NUL; the length framing keeps ("ab","c") and ("a","bc") apart.
func Object(namespace, key []byte) ObjectID {
	h := sha256.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(namespace)))
	h.Write(n[:])
	h.Write(namespace)
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write(key)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return ObjectID{Hi: binary.BigEndian.Uint64(sum[0:8]), Lo: binary.BigEndian.Uint64(sum[8:16])}
}

// Tenant returns the tenant hash: the first 8 bytes (big-endian) of
// SHA-256("DFKVTENANT1" || u64le(len(tenant)) || tenant).
func Tenant(tenant []byte) uint64 {
	h := sha256.New()
	h.Write([]byte(tenantDomain))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(tenant)))
	h.Write(n[:])
	h.Write(tenant)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return binary.BigEndian.Uint64(sum[0:8])
}
