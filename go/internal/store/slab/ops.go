//go:build linux

package slab

import (
	"fmt"
	"hash/crc32"
	"sync"
	"time"
	"unsafe"

	"github.com/dfkv/dfkv/go/internal/store"
)

// Put stores a value: fill writes it straight into an aligned buffer, the payload's
// O_DIRECT|O_DSYNC write and its record's group commit run side by side (see overlapped),
// and only once both are durable is the value published in the index.
func (e *Engine) Put(key store.Key, size int, fill func(dst []byte) error) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if size <= 0 {
		return fmt.Errorf("slab: put %s: size %d: %w", key.ID, size, store.ErrInvalid)
	}
	if int64(size) > e.cfg.MaxValueBytes {
		return fmt.Errorf("slab: put %s: %d bytes, max %d: %w", key.ID, size, e.cfg.MaxValueBytes, store.ErrTooLarge)
	}
	ci := e.classFor(size)
	cs := e.classes[ci].size
	buf, err := e.bufs.get(cs)
	if err != nil {
		return fmt.Errorf("slab: put %s: buffer of %d bytes: %w: %w", key.ID, cs, store.ErrIO, err)
	}
	defer e.bufs.put(buf)
	if err := fill(buf[:size]); err != nil {
		return err
	}
	return e.store(key, size, ci, buf)
}

// PutFrom stores src[:size] straight from the caller's aligned buffer (no staging copy);
// it zeroes src[size:alignUp(size)], the on-disk padding. See store.DirectWriter.
func (e *Engine) PutFrom(key store.Key, src []byte, size int) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if err := e.checkDirect(key, src, size); err != nil {
		return err
	}
	return e.store(key, size, e.classFor(size), src)
}

// checkDirect validates a PutFrom source.
func (e *Engine) checkDirect(key store.Key, src []byte, size int) error {
	if size <= 0 {
		return fmt.Errorf("slab: put %s: size %d: %w", key.ID, size, store.ErrInvalid)
	}
	if int64(size) > e.cfg.MaxValueBytes {
		return fmt.Errorf("slab: put %s: %d bytes, max %d: %w", key.ID, size, e.cfg.MaxValueBytes, store.ErrTooLarge)
	}
	if int64(len(src)) < alignUp(int64(size)) || !aligned(src) {
		return fmt.Errorf("slab: put %s: source buffer of %d bytes is unaligned or shorter than %d: %w",
			key.ID, len(src), alignUp(int64(size)), store.ErrInvalid)
	}
	return nil
}

// store writes buf[:size] (buf aligned, at least alignUp(size) long) as key's value in a
// slot of class ci: the payload's O_DIRECT|O_DSYNC write starts as soon as the slot is
// reserved, the record is written meanwhile and made durable by the table's group commit
// while the payload write runs, and the value is published (and the Put acknowledged) once
// both are durable. See overlapped for why the record may be durable before its payload.
func (e *Engine) store(key store.Key, size, ci int, buf []byte) error {
	var st staged
	if err := e.stage(&st, key, size, ci, buf, nil, false); err != nil {
		return err
	}
	e.overlapped([]*staged{&st})
	return e.finish(&st)
}

// overlapped makes the records of staged Puts durable with one table commit while their
// payload writes (started by stage) run, and returns when both are done. A record can
// therefore be durable before its payload: a crash in between leaves a record whose slot
// holds a torn payload or the bytes of the slot's previous tenant. That is safe because every
// read checks the payload against the record's CRC32C (a mismatch is a miss and drops the
// value), the record already makes the key's older version unreachable (its tombstone rides
// in the same commit, and the higher sequence wins at rebuild), and a Put is acknowledged
// only when both writes are durable. It saves the commit's latency on every Put: the payload
// write and the fdatasync overlap instead of following each other.
func (e *Engine) overlapped(sts []*staged) {
	need := false
	for _, st := range sts {
		need = need || st.recErr == nil
	}
	var commitErr error
	if need {
		commitErr = e.commitTable()
	}
	for _, st := range sts {
		st.payload.Wait()
		st.commitErr = commitErr
	}
}

// writePayload writes a staged Put's payload into its slot.
func (e *Engine) writePayload(st *staged) error {
	s := st.s
	n := alignUp(int64(st.size))
	if err := writeAt(s.ext.f, st.buf[:n], int64(s.idx)*e.classes[st.ci].size); err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("write extent %d slot %d: %w", s.ext.idx, s.idx, ioErr(err))
	}
	e.nWrites.Add(1)
	e.nWriteBytes.Add(n)
	return nil
}

// PutFromBatch implements store.BatchWriter: each item's payload write starts as its slot is
// reserved (so the batch's payloads are written in parallel), its record is written
// meanwhile, one table commit makes the batch's records durable together while the
// payloads are still being written (see overlapped), then each value is published. An item
// whose payload write fails is reported and its record retired.
// When an item would have to wait for a slot to be released while earlier items hold
// reservations (a small cache: they may be what it waits for), those are committed first.
func (e *Engine) PutFromBatch(items []store.DirectItem, errs []error) {
	if err := e.enter(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	defer e.leave()
	st := make([]staged, len(items))
	pending := make([]*staged, 0, len(items)) // staged, not yet committed
	at := make([]int, 0, len(items))
	commit := func() {
		if len(pending) > 0 {
			e.overlapped(pending)
		}
		for j, p := range pending {
			errs[at[j]] = e.finish(p)
		}
		pending, at = pending[:0], at[:0]
	}
	for i, it := range items {
		if err := e.checkDirect(it.Key, it.Src, it.Size); err != nil {
			errs[i] = err
			continue
		}
		ci := e.classFor(it.Size)
		var crc *uint32
		if it.HasCRC {
			crc = &items[i].CRC
		}
		err := e.stage(&st[i], it.Key, it.Size, ci, it.Src, crc, len(pending) > 0)
		if err == errWouldWait {
			commit()
			err = e.stage(&st[i], it.Key, it.Size, ci, it.Src, crc, false)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		pending, at = append(pending, &st[i]), append(at, i)
	}
	commit()
}

// staged is a Put between stage (slot reserved, payload write started, record written) and
// the table commit that, with the payload write, makes it durable.
type staged struct {
	key      store.Key
	size, ci int
	buf      []byte // the payload, alignUp(size) bytes with zeroed padding
	crc      uint32
	seq      uint64
	s        *slot
	prev     *slot // the value this Put replaces, pinned; nil if none
	prevTomb bool  // prev's tombstone was written (it rides in this Put's commit)
	tombs    []*slot
	recErr   error // the record write failed (the commit is then not needed for it)

	payload           sync.WaitGroup // the payload write stage started
	payErr, commitErr error          // set by the payload write and by overlapped

	victimBuf, tombBuf [8]*slot
}

// stage reserves a slot, starts the payload write, computes the CRC32C meanwhile (unless the
// caller knows it: crc), and
// writes, without syncing, the evicted values' tombstones, the replaced value's tombstone
// and the record; overlapped then commits and waits for the payload. An error means nothing
// is left to finish. The payload may land before or after the record: either order is a
// CRC miss after a crash until both are durable (see overlapped).
func (e *Engine) stage(st *staged, key store.Key, size, ci int, buf []byte, crc *uint32, noWait bool) error {
	n := alignUp(int64(size))
	clear(buf[size:n]) // the tail padding must not carry stale bytes of another value
	st.key, st.size, st.ci, st.buf = key, size, ci, buf

	s, evicted, taken, err := e.reserve(ci, st.victimBuf[:0], noWait)
	if err == errWouldWait {
		return err
	}
	if err != nil {
		return fmt.Errorf("slab: put %s (%d bytes): %w", key.ID, size, err)
	}
	st.s = s
	if taken {
		// The victim's record stays live in the table until this Put's record replaces
		// it, after the CRC (milliseconds for a large value). A tombstone now (no sync: any
		// later commit, this Put's included, makes it durable) keeps the window in which a
		// crash could bring the evicted value back as short as a retired victim's was. If
		// it fails, the record write below (or finish's retire) still replaces it.
		_ = e.writeTombstone(s)
	}
	st.payload.Add(1)
	go func() {
		defer st.payload.Done()
		st.payErr = e.writePayload(st)
	}()
	if crc != nil {
		st.crc = *crc
	} else {
		st.crc = crc32.Checksum(buf[:size], castagnoli) // while the device writes the same bytes
	}

	// The value this Put replaces (if any) is pinned, so that its slot cannot be reused
	// under the tombstone written below, and tombstoned in the same group commit as the new
	// record: an overwrite pays one shared fdatasync, not two. A crash between the two
	// writes leaves either both records live (the higher sequence wins at rebuild) or the
	// old one dead and the new one absent: a miss, never the older value after the ack.
	st.prev = e.pinCurrent(key)

	st.seq = e.seq.Add(1)
	rec := record{State: stateLive, Class: uint16(ci), Key: key, Length: uint32(size), CRC: st.crc,
		Seq: st.seq, Address: e.address(s), Epoch: e.epoch}
	// The evicted values' tombstones share the fsync of this record.
	st.tombs, _ = e.writeTombstones(evicted, st.tombBuf[:0])
	st.prevTomb = st.prev != nil && e.writeTombstone(st.prev) == nil
	var b [recordSize]byte
	rec.encode(b[:])
	if err := writeAt(e.tbl, b[:], int64(rec.Address)*recordSize); err != nil {
		e.nIO.Add(1)
		st.recErr = fmt.Errorf("record of extent %d slot %d: %w", s.ext.idx, s.idx, ioErr(err))
	}
	return nil
}

// finish completes a staged Put once overlapped returned: when the payload and the record
// are both durable the value is published (replacing prev), otherwise every trace is
// retired.
func (e *Engine) finish(st *staged) error {
	key, s, prev := st.key, st.s, st.prev
	if prev != nil {
		defer e.unpin(prev)
	}
	e.finishTombstones(st.tombs, st.commitErr)
	err := st.payErr
	if err == nil {
		err = st.recErr
	}
	if err == nil && st.commitErr != nil {
		e.nIO.Add(1)
		err = fmt.Errorf("record of extent %d slot %d: %w", s.ext.idx, s.idx, st.commitErr)
	}
	if err != nil {
		e.allocMu.Lock()
		e.killLocked(s, false)
		e.allocMu.Unlock()
		// The record may be durable (without its payload, or with it): tombstone before
		// reuse, so that the slot's next tenant is never read under this record.
		_ = e.retire([]*slot{s})
		if st.prevTomb {
			// The previous value's tombstone may be on disk: it must not outlive a restart
			// as the key's value, so it leaves the index now (a miss, never wrong bytes).
			e.drop(key, prev)
		}
		return fmt.Errorf("slab: put %s: %w", key.ID, err)
	}

	ext := s.ext
	e.allocMu.Lock()
	s.key, s.length, s.crc, s.seq = key, uint32(st.size), st.crc, st.seq
	// A new value starts unreferenced: it survives the next CLOCK sweep only if it is read
	// (or touched by the RAM tier) before the hand comes round. Values written and never
	// reused, most of a KV cache's PUTs, go first; with the bit set on insert this cache
	// hit 0.94-0.97x what LRU hits on the FAST'25 trace, without it 1.02x (BENCHMARKS.md).
	s.ref.Store(0)
	ext.lastAccess.Store(e.tick.Add(1))
	sh := e.shardOf(key)
	sh.mu.Lock()
	old := sh.m[key]
	if old != nil && old.seq > st.seq {
		// A concurrent Put with a later sequence number already published: it wins, as it
		// would at rebuild.
		sh.mu.Unlock()
		e.killLocked(s, false)
		// It was stored and at once superseded: report it so that accounting which charges
		// every successful Put stays balanced.
		e.observeLocked(key, int64(st.size), store.Replaced)
		e.allocMu.Unlock()
		return e.retire([]*slot{s})
	}
	sh.m[key] = s
	s.state = slotLive
	sh.mu.Unlock()
	e.classes[st.ci].reserved--
	ext.reserved--
	e.notifyLocked() // a waiting Put may now evict this class
	if old != nil {
		e.killLocked(old, false) // replaced: the object count is unchanged
		e.observeLocked(old.key, int64(old.length), store.Replaced)
	} else {
		e.objects++
	}
	e.allocMu.Unlock()
	if old != nil {
		if old == prev && st.prevTomb {
			// Its tombstone was durable with this Put's record; the slot is released when
			// the last pin (this Put's included) drops.
			old.tombDone.Store(true)
			return nil
		}
		// Replaced by a value this Put did not see (a concurrent Put won in between):
		// wait for its tombstone so that a later Remove cannot resurrect it on restart.
		if err := e.retire([]*slot{old}); err != nil {
			return fmt.Errorf("slab: put %s: retire previous value: %w", key.ID, err)
		}
	}
	return nil
}

// pinCurrent pins and returns key's current slot, or nil.
func (e *Engine) pinCurrent(key store.Key) *slot {
	sh := e.shardOf(key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	s := sh.m[key]
	if s != nil {
		s.pins.Add(1)
		s.ext.pins.Add(1)
	}
	return s
}

// Get reads the value into an aligned buffer, verifies its CRC32C and hands it to fn.
// The slot is pinned for the whole call, so it cannot be reused under fn.
func (e *Engine) Get(key store.Key, fn func(value []byte) error) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	s, err := e.pin(key, "get")
	if err != nil {
		return err
	}
	defer e.unpin(s)
	buf, err := e.bufs.get(s.ext.slotSize)
	if err != nil {
		return fmt.Errorf("slab: get %s: buffer of %d bytes: %w: %w", key.ID, s.ext.slotSize, store.ErrIO, err)
	}
	defer e.bufs.put(buf)
	length, err := e.readPinned(key, s, buf)
	if err != nil {
		return err
	}
	e.leases.Release(key) // the announced read happened
	return fn(buf[:length])
}

// ReadInto reads the whole value with one O_DIRECT read straight into dst and verifies its
// CRC32C. See store.DirectReader.
func (e *Engine) ReadInto(key store.Key, dst []byte) (int, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	if !aligned(dst) {
		return 0, fmt.Errorf("slab: read %s: destination buffer is not %d-aligned: %w", key.ID, blockSize, store.ErrInvalid)
	}
	s, err := e.pin(key, "read")
	if err != nil {
		return 0, err
	}
	defer e.unpin(s)
	if length := int64(s.length); alignUp(length) > int64(len(dst)) {
		return int(length), fmt.Errorf("slab: read %s: %d-byte value into %d bytes: %w", key.ID, length, len(dst), store.ErrBufferTooSmall)
	}
	n, err := e.readPinned(key, s, dst)
	if err == nil {
		e.leases.Release(key) // the announced read happened
	}
	return n, err
}

// pin looks key up and pins its slot (and extent) against reuse.
func (e *Engine) pin(key store.Key, op string) (*slot, error) {
	sh := e.shardOf(key)
	sh.mu.RLock()
	s := sh.m[key]
	if s == nil {
		sh.mu.RUnlock()
		return nil, fmt.Errorf("slab: %s %s: %w", op, key.ID, store.ErrNotFound)
	}
	s.pins.Add(1)
	s.ext.pins.Add(1)
	sh.mu.RUnlock()
	s.reference()
	s.ext.lastAccess.Store(e.tick.Add(1))
	return s, nil
}

// readPinned reads a pinned slot's payload into buf (aligned, at least alignUp(length)
// long) and verifies it; a mismatch drops the value.
func (e *Engine) readPinned(key store.Key, s *slot, buf []byte) (int, error) {
	ext := s.ext
	length, crc := int64(s.length), s.crc
	n := alignUp(length)
	if err := readAt(ext.f, buf[:n], int64(s.idx)*ext.slotSize); err != nil {
		e.nIO.Add(1)
		return 0, fmt.Errorf("slab: get %s: read extent %d slot %d: %w", key.ID, ext.idx, s.idx, ioErr(err))
	}
	e.nReads.Add(1)
	e.nReadBytes.Add(n)
	if crc32.Checksum(buf[:length], castagnoli) != crc {
		e.nCorrupt.Add(1)
		e.drop(key, s)
		// After a crash this is also how a PUT the crash interrupted reads (its record
		// durable, its payload not: see overlapped), hence the hint.
		e.log.Warn("slab: payload CRC mismatch; value dropped", "object", key.ID.String(), "extent", ext.idx, "slot", s.idx,
			"after_unclean_stop", e.unclean)
		return 0, fmt.Errorf("slab: get %s: extent %d slot %d: %w: %w", key.ID, ext.idx, s.idx, store.ErrNotFound, store.ErrCorrupt)
	}
	return int(length), nil
}

func aligned(b []byte) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%blockSize == 0
}

// Stat returns the stored length of a value.
func (e *Engine) Stat(key store.Key) (int64, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	sh := e.shardOf(key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if s := sh.m[key]; s != nil {
		return int64(s.length), nil
	}
	return 0, fmt.Errorf("slab: stat %s: %w", key.ID, store.ErrNotFound)
}

// Has implements store.Haser: Stat without an error to build for a miss.
func (e *Engine) Has(key store.Key) (bool, error) {
	if err := e.enter(); err != nil {
		return false, err
	}
	defer e.leave()
	sh := e.shardOf(key)
	sh.mu.RLock()
	ok := sh.m[key] != nil
	sh.mu.RUnlock()
	return ok, nil
}

// Remove drops the value from the index at once and makes its tombstone durable; the
// slot is reused only after every reader pinning it has finished.
func (e *Engine) Remove(key store.Key) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	e.allocMu.Lock()
	sh := e.shardOf(key)
	sh.mu.Lock()
	s := sh.m[key]
	if s == nil {
		sh.mu.Unlock()
		e.allocMu.Unlock()
		return fmt.Errorf("slab: remove %s: %w", key.ID, store.ErrNotFound)
	}
	delete(sh.m, key)
	sh.mu.Unlock()
	e.killLocked(s, true)
	e.observeLocked(key, int64(s.length), store.Removed)
	e.allocMu.Unlock()
	if err := e.retire([]*slot{s}); err != nil {
		return fmt.Errorf("slab: remove %s: %w", key.ID, err)
	}
	return nil
}

// drop removes a value that failed verification, if it is still the current one.
func (e *Engine) drop(key store.Key, s *slot) {
	e.allocMu.Lock()
	sh := e.shardOf(key)
	sh.mu.Lock()
	if sh.m[key] != s {
		sh.mu.Unlock()
		e.allocMu.Unlock()
		return
	}
	delete(sh.m, key)
	sh.mu.Unlock()
	e.killLocked(s, true)
	e.observeLocked(key, int64(s.length), store.Dropped)
	e.allocMu.Unlock()
	_ = e.retire([]*slot{s})
}

func (e *Engine) unpin(s *slot) {
	s.ext.pins.Add(-1)
	if s.pins.Add(-1) == 0 {
		e.tryRelease(s)
	}
}

func (e *Engine) commitTable() error {
	if err := e.tblSync.commit(); err != nil {
		e.syncFails.Add(1)
		return fmt.Errorf("sync %s: %w", tableName, ioErr(err))
	}
	e.syncFails.Store(0)
	return nil
}

// retire makes the tombstones of dead slots durable (one shared fsync) and then releases
// every slot no reader still pins. A slot whose tombstone fails is quarantined.
func (e *Engine) retire(victims []*slot) error {
	if len(victims) == 0 {
		return nil
	}
	var okBuf [8]*slot // the common case (one or a few victims) does not allocate
	ok, firstErr := e.writeTombstones(victims, okBuf[:0])
	var err error
	if len(ok) > 0 {
		err = e.commitTable()
	}
	e.finishTombstones(ok, err)
	if err != nil {
		e.nIO.Add(1)
		return err
	}
	return firstErr
}

// writeTombstones writes (without syncing) the tombstones of dead slots, appending the
// slots whose write succeeded to ok; a slot whose write fails is quarantined.
func (e *Engine) writeTombstones(victims, ok []*slot) ([]*slot, error) {
	var firstErr error
	for _, s := range victims {
		if err := e.writeTombstone(s); err != nil {
			e.quarantine(s)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		ok = append(ok, s)
	}
	return ok, firstErr
}

// writeTombstone writes (without syncing) the tombstone of a slot the caller keeps from
// reuse (dead and unreleased, or pinned).
func (e *Engine) writeTombstone(s *slot) error {
	var b [recordSize]byte
	r := record{State: stateTombstone, Class: uint16(s.ext.class), Key: s.key,
		Seq: e.seq.Add(1), Address: e.address(s), Epoch: e.epoch}
	r.encode(b[:])
	if err := writeAt(e.tbl, b[:], int64(r.Address)*recordSize); err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("tombstone extent %d slot %d: %w", s.ext.idx, s.idx, ioErr(err))
	}
	return nil
}

// finishTombstones releases slots whose tombstones were written, once the table sync
// that covers them returned syncErr: durable ones become reusable (when unpinned), the
// others are quarantined.
func (e *Engine) finishTombstones(ok []*slot, syncErr error) {
	for _, s := range ok {
		if syncErr != nil {
			e.quarantine(s)
			continue
		}
		s.tombDone.Store(true)
		e.tryRelease(s)
	}
}

// Lease implements store.Leaser. It runs under the allocator lock so that an eviction scan
// never sees a slot half-leased: a slot is either leased before the scan looks at it or
// the scan evicted it first and the lookup answers NotFound.
func (e *Engine) Lease(key store.Key, ttl time.Duration) (int64, bool, error) {
	if err := e.enter(); err != nil {
		return 0, false, err
	}
	defer e.leave()
	e.allocMu.Lock()
	defer e.allocMu.Unlock()
	sh := e.shardOf(key)
	sh.mu.RLock()
	s := sh.m[key]
	sh.mu.RUnlock()
	if s == nil || s.state != slotLive {
		return 0, false, fmt.Errorf("slab: lease %s: %w", key.ID, store.ErrNotFound)
	}
	return int64(s.length), e.leases.Grant(key, s.ext.slotSize, ttl, s), nil
}

// ReleaseLease implements store.Leaser.
func (e *Engine) ReleaseLease(key store.Key) { e.leases.Release(key) }

// LeaseStats implements store.Leaser.
func (e *Engine) LeaseStats() store.LeaseStats { return e.leases.Stats() }

// Leases exposes the lease table (tests force expiry through its clock).
func (e *Engine) Leases() *store.Leases { return e.leases }

// leaseChanged keeps the lock-free flags the eviction scans read in step with the table.
func leaseChanged(tag any, held bool) {
	s := tag.(*slot)
	if s.leased.Swap(held) != held {
		if held {
			s.ext.leases.Add(1)
		} else {
			s.ext.leases.Add(-1)
		}
	}
}
