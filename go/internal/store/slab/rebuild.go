//go:build linux

package slab

import "fmt"

// rebuildChunk is the size of one sequential table read at Open.
const rebuildChunk = 8 << 20

type rebuildStats struct {
	records int // valid records read (live and tombstones)
	bad     int // records that failed verification or made no sense; ignored
	stale   int // live records superseded by a newer one for the same key; tombstoned
}

// rebuild reads slots.tbl in large sequential chunks (skipping holes), verifies every
// record, assigns extents to classes, and rebuilds the index. Records are laid out
// extent-major, so each extent's records are complete when the address moves past it.
func (e *Engine) rebuild() (rebuildStats, error) {
	var st rebuildStats
	fst, err := e.tbl.Stat()
	if err != nil {
		return st, err
	}
	size := fst.Size - fst.Size%recordSize
	buf := make([]byte, rebuildChunk)
	var (
		cur    = -1 // extent whose records are being collected
		recs   []record
		stale  []*slot
		maxSeq uint64
	)
	flush := func() {
		if cur >= 0 && len(recs) > 0 {
			stale = e.loadExtent(e.extents[cur], recs, stale, &st)
		}
		recs = recs[:0]
	}
	for _, seg := range e.tbl.DataSegments(size) {
		start := seg[0] - seg[0]%recordSize
		for off := start; off < seg[1]; {
			n := min(int64(len(buf)), seg[1]-off)
			n -= n % recordSize
			if n == 0 {
				n = recordSize
			}
			if err := readAt(e.tbl, buf[:n], off); err != nil {
				return st, fmt.Errorf("read at %d: %w", off, err)
			}
			for i := int64(0); i < n; i += recordSize {
				r, err := decodeRecord(buf[i : i+recordSize])
				if err == errRecordEmpty {
					continue
				}
				addr := uint64((off + i) / recordSize)
				if err != nil || r.Address != addr {
					st.bad++
					continue
				}
				st.records++
				maxSeq = max(maxSeq, r.Seq)
				if r.State != stateLive {
					continue
				}
				ext := int(addr / uint64(e.maxSlots))
				if ext >= len(e.extents) {
					st.bad++
					continue
				}
				if ext != cur {
					flush()
					cur = ext
				}
				recs = append(recs, r)
			}
			off += n
		}
	}
	flush()
	e.seq.Store(maxSeq)

	// Losers of duplicate keys still read as live on disk: tombstone them before their
	// slots can be reused, or a later Remove of the winner would resurrect them.
	if len(stale) > 0 {
		e.allocMu.Lock()
		for _, s := range stale {
			s.state = slotDead
			e.classes[s.ext.class].pending++
		}
		e.allocMu.Unlock()
		if err := e.retire(stale); err != nil {
			return st, fmt.Errorf("tombstone %d stale records: %w", len(stale), err)
		}
	}
	st.stale = len(stale)

	for _, ext := range e.extents {
		if ext.class < 0 {
			e.pool = append(e.pool, ext)
		}
	}
	// Hand out low-numbered extents first (cosmetic, but makes layouts predictable).
	for i, j := 0, len(e.pool)-1; i < j; i, j = i+1, j-1 {
		e.pool[i], e.pool[j] = e.pool[j], e.pool[i]
	}
	return st, nil
}

// loadExtent installs the live records of one extent. The extent's class is that of its
// newest record; records of another class, bad geometry or older duplicates are ignored
// (duplicates are returned as stale slots to be tombstoned).
func (e *Engine) loadExtent(ext *extent, recs []record, stale []*slot, st *rebuildStats) []*slot {
	newest := 0
	for i := range recs {
		if recs[i].Seq > recs[newest].Seq {
			newest = i
		}
	}
	ci := int(recs[newest].Class)
	if ci >= len(e.classes) {
		st.bad += len(recs)
		return stale
	}
	e.assignLocked(ext, ci) // single-threaded here; the lock is not needed yet
	cs := e.classes[ci].size
	for _, r := range recs {
		si := int64(r.Address) - int64(ext.idx)*e.maxSlots
		if int(r.Class) != ci || si >= int64(len(ext.slots)) || int64(r.Length) > cs || int64(r.Length) > e.cfg.MaxValueBytes {
			st.bad++
			continue
		}
		s := &ext.slots[si]
		if s.state != slotFree { // two records for one address cannot happen; be safe
			st.bad++
			continue
		}
		s.state, s.key, s.length, s.crc, s.seq = slotLive, r.Key, r.Length, r.CRC, r.Seq
		ext.used++
		sh := e.shardOf(r.Key)
		old := sh.m[r.Key]
		switch {
		case old == nil:
			sh.m[r.Key] = s
			e.objects++
			e.used += cs
		case old.seq < s.seq:
			sh.m[r.Key] = s
			e.used += cs - old.ext.slotSize
			stale = append(stale, old)
		default:
			stale = append(stale, s)
		}
	}
	if ext.used == 0 {
		// Nothing usable: give the extent back to the pool.
		c := &e.classes[ci]
		c.extents = c.extents[:len(c.extents)-1]
		ext.class, ext.slotSize, ext.slots, ext.free = -1, 0, nil, nil
		return stale
	}
	for i := len(ext.slots) - 1; i >= 0; i-- {
		if ext.slots[i].state == slotFree {
			ext.free = append(ext.free, int32(i))
		}
	}
	if len(ext.free) > 0 {
		ext.inAvail = true
		e.classes[ci].avail = append(e.classes[ci].avail, ext)
	}
	return stale
}
