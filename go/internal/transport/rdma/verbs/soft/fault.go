package soft

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Test-only environment. Both are read by New when the Options leave the setting unset, so
// that every process of a cross-process test (server, client, test binary) agrees.
const (
	// DevicesEnv is how many soft devices (soft0, soft1, …) a process has: 1..MaxDevices.
	// The binaries read it (see ParseDevices) into Options.Devices; the package reads no
	// environment.
	DevicesEnv = "DFKV_SOFT_RDMA_DEVICES"
	// FaultsEnv names the fault file (see ParseFaults), read by the binaries into
	// Options.FaultFile. Test-only: production never sets it.
	FaultsEnv = "DFKV_SOFT_RDMA_FAULTS"
	// NUMAEnv gives the devices NUMA nodes ("0,1,0,1": softN gets entry N; see
	// ParseNUMANodes), read by the binaries into Options.NUMANodes. Test-only.
	NUMAEnv = "DFKV_SOFT_RDMA_NUMA"
)

// ParseNUMANodes parses a NUMAEnv value: nil when empty, else up to MaxDevices node
// numbers 0..1023, comma separated ("-1": unknown).
func ParseNUMANodes(v string) ([]int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > MaxDevices {
		return nil, fmt.Errorf("soft: %s: %d entries (max %d)", NUMAEnv, len(parts), MaxDevices)
	}
	out := make([]int, 0, len(parts))
	for _, f := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < -1 || n > 1023 {
			return nil, fmt.Errorf("soft: %s=%q: want node numbers -1..1023", NUMAEnv, v)
		}
		out = append(out, n)
	}
	return out, nil
}

// MaxDevices bounds the devices one soft provider creates.
const MaxDevices = 64

// maxFaultFile bounds the fault file a provider reads (a test writes a few lines).
const maxFaultFile = 64 << 10

// Fault is the injected state of one soft device.
type Fault struct {
	// PortDown reports the port DOWN / DISABLED and fails every WR of the device's QPs with
	// transport-retry-exceeded (as a dead link does once the retries run out), on both the
	// requester and the responder side; new streams to the device are refused.
	PortDown bool
	// PortStall reports the port DOWN / DISABLED like PortDown, but the device's QPs see
	// nothing: their WRs stay queued, neither sent nor failed, until the port comes back.
	// That is Soft-RoCE after `ip link set … down` (no async event, no completion error).
	PortStall bool
	// QueryFail leaves the device out of Provider.Devices (the query failed).
	QueryFail bool
	// CompErrors is how many of the device's next send WRs complete with CompStatus (the QP
	// then goes to ERR and flushes the rest, as on hardware). Counted from each reload.
	CompErrors int
	CompStatus verbs.WCStatus
	// CompAfter send WRs of the device complete normally before the first injected error
	// (counted from each reload): a test injects the error into the middle of a batch it
	// starts afterwards, without racing the batch.
	CompAfter int
	// Delay holds every send completion of the device's QPs this long (a slow ACK).
	Delay time.Duration
	// StaleWCs is how many stale completions to inject: at each of the device's next
	// post_sends on a QP in RTS, a copy of the last successful send completion of another
	// (earlier) QP of the device lands on the posting QP's send CQ first, as a late
	// completion of an old QP generation does on a CQ a reconnect reuses. Counted from
	// each reload; nothing is injected until another QP has completed a signaled send.
	StaleWCs int
}

// ParseFaults decodes a fault file: one directive per line, '#' starts a comment.
//
//	<device> port down|up|stall                          (stall: down, WRs held, no error)
//	<device> query fail|ok
//	<device> comp_err <count> [<ibv_wc_status number>] [after <n>]
//	                                                     (status default 12, retry exceeded;
//	                                                     after: n send WRs succeed first)
//	<device> delay <duration>                            (e.g. 250ms; 0 clears)
//	<device> stale_wc <count>                            (old-generation completions)
//
// Later lines win. Anything else is an error naming the line.
func ParseFaults(text string) (map[string]Fault, error) {
	if len(text) > maxFaultFile {
		return nil, fmt.Errorf("soft: fault file of %d bytes (max %d)", len(text), maxFaultFile)
	}
	out := map[string]Fault{}
	for i, line := range strings.Split(text, "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("soft: fault file line %d %q: %s", i+1, strings.TrimSpace(line), why)
		}
		if len(f) < 3 {
			return nil, bad("want <device> <directive> <value>")
		}
		dev, st := f[0], out[f[0]]
		if !printable(dev) || len(dev) > 64 {
			return nil, bad("device name must be 1..64 printable bytes")
		}
		switch f[1] {
		case "port", "query":
			if len(f) != 3 {
				return nil, bad("one value")
			}
			on, off := "up", "down"
			if f[1] == "query" {
				on, off = "ok", "fail"
			}
			var down bool
			switch {
			case f[2] == on:
			case f[2] == off:
				down = true
			case f[1] == "port" && f[2] == "stall":
				st.PortDown, st.PortStall = false, true
				out[dev] = st
				continue
			case f[1] == "port":
				return nil, bad("want up, down or stall")
			default:
				return nil, bad("want " + on + " or " + off)
			}
			if f[1] == "port" {
				st.PortDown, st.PortStall = down, false
			} else {
				st.QueryFail = down
			}
		case "comp_err":
			args := f[2:]
			after := 0
			if k := len(args); k >= 2 && args[k-2] == "after" {
				n, err := strconv.Atoi(args[k-1])
				if err != nil || n < 0 || n > 1<<20 {
					return nil, bad("after must be 0..1048576")
				}
				after, args = n, args[:k-2]
			}
			if len(args) < 1 || len(args) > 2 {
				return nil, bad("want comp_err <count> [status] [after <n>]")
			}
			n, err := strconv.Atoi(args[0])
			if err != nil || n < 0 || n > 1<<20 {
				return nil, bad("count must be 0..1048576")
			}
			st.CompErrors, st.CompStatus, st.CompAfter = n, verbs.StatusRetryExcErr, after
			if len(args) == 2 {
				s, err := strconv.Atoi(args[1])
				if err != nil || s <= 0 || s > 255 || verbs.WCStatus(s) == verbs.StatusWRFlushErr {
					return nil, bad("status must be a failing ibv_wc_status number (1..255, not 5)")
				}
				st.CompStatus = verbs.WCStatus(s)
			}
		case "delay":
			if len(f) != 3 {
				return nil, bad("one duration")
			}
			d, err := time.ParseDuration(f[2])
			if err != nil || d < 0 || d > time.Minute {
				return nil, bad("duration must be 0..1m")
			}
			st.Delay = d
		case "stale_wc":
			if len(f) != 3 {
				return nil, bad("want stale_wc <count>")
			}
			n, err := strconv.Atoi(f[2])
			if err != nil || n < 0 || n > 1<<20 {
				return nil, bad("count must be 0..1048576")
			}
			st.StaleWCs = n
		default:
			return nil, bad("unknown directive (port, query, comp_err, delay, stale_wc)")
		}
		out[dev] = st
	}
	return out, nil
}

func printable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// WriteFaults replaces the fault file atomically (a temporary file renamed over it), so a
// provider never reads half a file. For tests.
func WriteFaults(path, text string) error {
	if _, err := ParseFaults(text); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// faultFile is a provider's view of its fault file, re-read whenever the file changes
// (inode, size or modification time). Only test processes have one: with no file
// configured the provider never calls into it.
type faultFile struct {
	path string
	p    *Provider

	mu     sync.Mutex
	ver    [4]int64 // inode, size, mtime (ns), existed
	faults map[string]Fault
	badVer [4]int64 // the version last reported unreadable (logged once)
}

func (f *faultFile) refreshLocked() {
	var ver [4]int64
	fi, err := os.Stat(f.path)
	if err == nil {
		ver = [4]int64{0, fi.Size(), fi.ModTime().UnixNano(), 1}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			ver[0] = int64(st.Ino)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return // keep what we have; a transient stat error is not a fault change
	}
	if ver == f.ver {
		return
	}
	var faults map[string]Fault
	if ver[3] == 1 {
		b, err := os.ReadFile(f.path)
		if err == nil {
			faults, err = ParseFaults(string(b))
		}
		if err != nil {
			if ver != f.badVer {
				f.badVer = ver
				f.p.opt.Logger.Warn("soft: fault file ignored", "path", f.path, "err", err)
			}
			return
		}
	}
	f.ver, f.faults = ver, faults
}

// get returns the device's current fault state.
func (f *faultFile) get(dev string) Fault {
	if f == nil {
		return Fault{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshLocked()
	return f.faults[dev]
}

// takeCompErr consumes one injected completion error of dev, if any is left.
func (f *faultFile) takeCompErr(dev string) (verbs.WCStatus, bool) {
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshLocked()
	st, ok := f.faults[dev]
	if !ok || st.CompErrors == 0 {
		return 0, false
	}
	if st.CompAfter > 0 {
		st.CompAfter--
		f.faults[dev] = st
		return 0, false
	}
	st.CompErrors--
	f.faults[dev] = st
	return st.CompStatus, true
}

// takeStaleWC consumes one injected stale completion of dev, if any is left and ok.
func (f *faultFile) takeStaleWC(dev string, ok func() bool) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshLocked()
	st, found := f.faults[dev]
	if !found || st.StaleWCs == 0 || !ok() {
		return false
	}
	st.StaleWCs--
	f.faults[dev] = st
	return true
}

// ParseDevices parses a DevicesEnv value: 0 when empty, else 1..MaxDevices.
func ParseDevices(v string) (int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxDevices {
		return 0, fmt.Errorf("soft: %s=%q: want 1..%d", DevicesEnv, v, MaxDevices)
	}
	return n, nil
}
