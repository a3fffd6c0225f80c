package soft

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

func TestParseFaults(t *testing.T) {
	got, err := ParseFaults(`
# a comment
soft0 port down
soft1 comp_err 3        # default status
soft1 delay 250ms
soft2 comp_err 1 10
soft2 query fail
soft0 port up           # later lines win
soft3 port down
soft3 stale_wc 2
soft4 comp_err 2 after 5
soft5 comp_err 1 10 after 0
soft6 port down
soft6 port stall        # stall replaces down
`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Fault{
		"soft0": {},
		"soft1": {CompErrors: 3, CompStatus: verbs.StatusRetryExcErr, Delay: 250 * time.Millisecond},
		"soft2": {CompErrors: 1, CompStatus: verbs.StatusRemAccessErr, QueryFail: true},
		"soft3": {PortDown: true, StaleWCs: 2},
		"soft4": {CompErrors: 2, CompStatus: verbs.StatusRetryExcErr, CompAfter: 5},
		"soft5": {CompErrors: 1, CompStatus: verbs.StatusRemAccessErr},
		"soft6": {PortStall: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %+v, want %+v", k, got[k], v)
		}
	}
	for _, bad := range []string{
		"soft0 port sideways", "soft0 port", "soft0 query stall", "soft0 port down now", "soft0 query maybe",
		"soft0 comp_err -1", "soft0 comp_err x", "soft0 comp_err 1 5", "soft0 comp_err 1 0", "soft0 comp_err 1 300",
		"soft0 comp_err 1 2 3", "soft0 comp_err 1 after", "soft0 comp_err 1 after -1", "soft0 comp_err after 2",
		"soft0 comp_err 1 10 after x", "soft0 delay forever", "soft0 delay -1s", "soft0 delay 2m", "soft0 reboot now",
		"soft0 stale_wc", "soft0 stale_wc -1", "soft0 stale_wc x", "soft0 stale_wc 1 2",
		"soft\x01 port down", strings.Repeat("x", 65) + " port down", strings.Repeat("#", maxFaultFile+1),
	} {
		if _, err := ParseFaults(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseFaults(f *testing.F) {
	f.Add("soft0 port down\nsoft1 comp_err 2 12\nsoft1 delay 10ms\n")
	f.Add("soft0 query fail # x")
	f.Add("soft1 stale_wc 3\nsoft1 stale_wc 0")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseFaults(s)
		if err != nil {
			return
		}
		for dev, st := range m {
			if !printable(dev) || st.CompErrors < 0 || st.Delay < 0 || (st.CompErrors > 0 && st.CompStatus == verbs.StatusSuccess) {
				t.Fatalf("%q: %q %+v", s, dev, st)
			}
		}
	})
}

func TestDeviceCount(t *testing.T) {
	n, err := ParseDevices(" 4 ")
	if err != nil || n != 4 {
		t.Fatalf("ParseDevices(4) = %d, %v", n, err)
	}
	p, err := New(Options{Devices: n})
	if err != nil {
		t.Fatal(err)
	}
	if devs, err := p.Devices(); err != nil || len(devs) != 4 || devs[3].Name != "soft3" {
		t.Fatalf("%+v %v", devs, err)
	}
	// No count: one device.
	if p, err = New(Options{}); err != nil {
		t.Fatal(err)
	}
	if devs, _ := p.Devices(); len(devs) != 1 {
		t.Fatalf("%d devices", len(devs))
	}
	if n, err := ParseDevices(""); n != 0 || err != nil {
		t.Fatalf("ParseDevices(\"\") = %d, %v", n, err)
	}
	for _, bad := range []string{"0", "65", "two", "-1"} {
		if _, err := ParseDevices(bad); err == nil || !strings.Contains(err.Error(), DevicesEnv) {
			t.Errorf("%s=%q: %v", DevicesEnv, bad, err)
		}
	}
	if _, err := New(Options{Devices: MaxDevices + 1}); err == nil {
		t.Error("65 devices accepted")
	}
}

// faultPair is pair() with a fault file the test rewrites.
func faultPair(t *testing.T) (a, b *node, p *Provider, set func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "faults")
	p, err := New(Options{Devices: 2, FaultFile: path, AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	set = func(s string) {
		t.Helper()
		if err := WriteFaults(path, s); err != nil {
			t.Fatal(err)
		}
	}
	a, b = newNode(t, p, "soft0", nodeCfg{}), newNode(t, p, "soft1", nodeCfg{})
	connectPair(t, a, b)
	return a, b, p, set
}

func portOf(t *testing.T, p *Provider, dev string) (verbs.PortInfo, bool) {
	t.Helper()
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Name == dev {
			return d.Ports[0], true
		}
	}
	return verbs.PortInfo{}, false
}

func TestFaultPortDownRequesterAndRecovery(t *testing.T) {
	a, b, p, set := faultPair(t)
	src := a.reg(4096, verbs.AccessLocalWrite)
	dst := b.reg(4096, allRemote)
	fill(src.Bytes(), 3)
	set("soft0 port down\n")
	if port, ok := portOf(t, p, "soft0"); !ok || port.State != verbs.PortDown || port.PhysState != verbs.PhysDisabled {
		t.Fatalf("soft0 while down: %+v %v", port, ok)
	}
	if port, _ := portOf(t, p, "soft1"); port.State != verbs.PortActive {
		t.Fatalf("soft1 follows soft0: %+v", port)
	}
	if a.ctx.Info().Ports[0].State != verbs.PortDown {
		t.Fatal("an open context does not see the port go down")
	}
	a.post(signaledWrite(1, src, dst, 4096),
		signaledWrite(2, src, dst, 8))
	expectWC(t, a.scq, 1, verbs.StatusRetryExcErr)
	expectWC(t, a.scq, 2, verbs.StatusWRFlushErr)
	if a.qp.State() != verbs.QPErr {
		t.Fatalf("qp %s after the link went down", a.qp.State())
	}
	if !bytes.Equal(dst.Bytes(), make([]byte, 4096)) {
		t.Fatal("bytes landed over a down port")
	}
	// The port comes back: a fresh QP pair works, and the port reads ACTIVE again.
	set("soft0 port up\n")
	if port, _ := portOf(t, p, "soft0"); port.State != verbs.PortActive || port.PhysState != verbs.PhysLinkUp {
		t.Fatalf("soft0 after up: %+v", port)
	}
	a2, b2 := newNode(t, p, "soft0", nodeCfg{}), newNode(t, p, "soft1", nodeCfg{})
	connectPair(t, a2, b2)
	src2, dst2 := a2.reg(4096, verbs.AccessLocalWrite), b2.reg(4096, allRemote)
	fill(src2.Bytes(), 4)
	a2.post(signaledWrite(3, src2, dst2, 4096))
	expectWC(t, a2.scq, 3, verbs.StatusSuccess)
	if !bytes.Equal(src2.Bytes(), dst2.Bytes()) {
		t.Fatal("bytes differ after recovery")
	}
}

func TestFaultPortDownResponder(t *testing.T) {
	a, b, _, set := faultPair(t)
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	// One WRITE first, so that the stream exists before the responder's port goes down.
	a.post(signaledWrite(1, src, dst, 8))
	expectWC(t, a.scq, 1, verbs.StatusSuccess)
	set("soft1 port down\n")
	a.post(signaledWrite(2, src, dst, 8))
	expectWC(t, a.scq, 2, verbs.StatusRetryExcErr)
	if b.qp.State() != verbs.QPErr {
		t.Fatalf("responder qp %s", b.qp.State())
	}
}

func TestFaultCompletionErrors(t *testing.T) {
	a, b, p, set := faultPair(t)
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	fill(src.Bytes(), 5)
	set("soft0 comp_err 1 10\n")
	a.post(signaledWrite(7, src, dst, 64),
		verbs.SendWR{ID: 8, Opcode: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	expectWC(t, a.scq, 7, verbs.StatusRemAccessErr)
	expectWC(t, a.scq, 8, verbs.StatusWRFlushErr)
	if !bytes.Equal(dst.Bytes(), make([]byte, 64)) {
		t.Fatal("an injected completion error let bytes land")
	}
	// The one planned error is used up: a fresh pair on the same devices succeeds.
	a2, b2 := newNode(t, p, "soft0", nodeCfg{}), newNode(t, p, "soft1", nodeCfg{})
	connectPair(t, a2, b2)
	src2, dst2 := a2.reg(64, verbs.AccessLocalWrite), b2.reg(64, allRemote)
	fill(src2.Bytes(), 6)
	a2.post(signaledWrite(9, src2, dst2, 64))
	expectWC(t, a2.scq, 9, verbs.StatusSuccess)
	if !bytes.Equal(src2.Bytes(), dst2.Bytes()) {
		t.Fatal("bytes differ")
	}
}

// comp_err … after n: the device's first n send WRs succeed, the next one fails.
func TestFaultCompletionErrorAfter(t *testing.T) {
	a, b, _, set := faultPair(t)
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	fill(src.Bytes(), 3)
	set("soft0 comp_err 1 after 2\n")
	for id := uint64(1); id <= 3; id++ {
		a.post(signaledWrite(id, src, dst, 64))
		want := verbs.StatusSuccess
		if id == 3 {
			want = verbs.StatusRetryExcErr
		}
		expectWC(t, a.scq, id, want)
	}
}

func TestFaultDelayedCompletion(t *testing.T) {
	a, b, _, set := faultPair(t)
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	const delay = 300 * time.Millisecond
	set("soft0 delay 300ms\n")
	b.postRecv(verbs.RecvWR{ID: 1})
	start := time.Now()
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 64)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey(), Imm: 42})
	// The responder has the data and the immediate (so the ACK is on its way) ...
	if wc := expectWC(t, b.rcq, 1, verbs.StatusSuccess); wc.Imm != 42 {
		t.Fatalf("imm %d", wc.Imm)
	}
	// ... but the requester's completion is held for the injected delay.
	expectWC(t, a.scq, 1, verbs.StatusSuccess)
	if el := time.Since(start); el < delay {
		t.Fatalf("completion after %v, before the injected %v", el, delay)
	}
	set("")
	start = time.Now()
	a.post(signaledWrite(2, src, dst, 64))
	expectWC(t, a.scq, 2, verbs.StatusSuccess)
}

// stale_wc: after another QP of the device completed a send, the next post_send on a new
// QP finds that old completion (its wr_id, its QP number) on its CQ before its own; with
// no earlier completion nothing is injected and the count is kept.
func TestFaultStaleCompletion(t *testing.T) {
	a, b, p, set := faultPair(t)
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	set("soft0 stale_wc 1\n")
	write := func(n *node, id uint64, src, dst verbs.MR) {
		n.post(signaledWrite(id, src, dst, 8))
	}
	write(a, 0x1_00000003, src, dst) // no other QP completed yet: nothing injected
	expectWC(t, a.scq, 0x1_00000003, verbs.StatusSuccess)
	a2, b2 := newNode(t, p, "soft0", nodeCfg{}), newNode(t, p, "soft1", nodeCfg{})
	connectPair(t, a2, b2)
	src2, dst2 := a2.reg(64, verbs.AccessLocalWrite), b2.reg(64, allRemote)
	write(a2, 0x2_00000003, src2, dst2)
	old := expectWC(t, a2.scq, 0x1_00000003, verbs.StatusSuccess)
	if old.QPNum != a.qp.Num() {
		t.Fatalf("stale completion from qp %d, want the old qp %d", old.QPNum, a.qp.Num())
	}
	expectWC(t, a2.scq, 0x2_00000003, verbs.StatusSuccess)
	write(a2, 0x2_00000004, src2, dst2) // the one injection is used up
	expectWC(t, a2.scq, 0x2_00000004, verbs.StatusSuccess)
}

func TestFaultQueryFailAndBadFile(t *testing.T) {
	_, _, p, set := faultPair(t)
	set("soft1 query fail\n")
	if _, ok := portOf(t, p, "soft1"); ok {
		t.Fatal("soft1 listed while its query fails")
	}
	if _, ok := portOf(t, p, "soft0"); !ok {
		t.Fatal("soft0 vanished too")
	}
	set("soft0 query fail\nsoft1 query fail\n")
	if _, err := p.Devices(); err == nil {
		t.Fatal("no device queried, no error")
	}
	// A file that does not parse is ignored (logged once): the last good state stays.
	set("soft1 query fail\n")
	if _, ok := portOf(t, p, "soft0"); !ok {
		t.Fatal("soft0 still failing")
	}
	path := p.faults.path
	if err := os.WriteFile(path+".x", []byte("soft0 port sideways\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".x", path); err != nil {
		t.Fatal(err)
	}
	if _, ok := portOf(t, p, "soft1"); ok {
		t.Fatal("a bad file dropped the last good state")
	}
	if err := WriteFaults(path, "soft0 port sideways\n"); err == nil {
		t.Fatal("WriteFaults wrote a bad file")
	}
	// Removing the file clears every fault.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, ok := portOf(t, p, "soft1"); !ok {
		t.Fatal("soft1 still failing without a fault file")
	}
}

func TestParseNUMANodes(t *testing.T) {
	got, err := ParseNUMANodes(" 0, 1,-1 ")
	if err != nil || len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != -1 {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := ParseNUMANodes(""); got != nil || err != nil {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"x", "0,,1", "-2", "1024", strings.Repeat("0,", MaxDevices) + "0"} {
		if _, err := ParseNUMANodes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p, err := New(Options{Devices: 3, NUMANodes: []int{1, 0}})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1, 0, -1} {
		if infos[i].NUMANode != want {
			t.Errorf("%s: node %d, want %d", infos[i].Name, infos[i].NUMANode, want)
		}
	}
}

// signaledWrite is a signaled RDMA WRITE of src[:n] to dst.
func signaledWrite(id uint64, src, dst verbs.MR, n int) verbs.SendWR {
	return verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, n)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey()}
}
