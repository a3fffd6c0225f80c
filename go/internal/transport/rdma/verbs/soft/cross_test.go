package soft

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// The cross-process tests re-execute this test binary as the remote side: a process with
// its own soft device, an MR and a QP, driven by commands on stdin and reporting its
// completions on stdout. Bootstrap (endpoint exchange) goes over the same pipes, as dfkv's
// goes over the TCP data port.

const helperEnv = "DFKV_SOFT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		if err := helperMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type helperHello struct {
	EP      verbs.Endpoint
	Addr    uint64
	RKey    uint32
	Len     int
	RecvLen int
}

const (
	helperMRLen = 8 << 20
	recvSlot    = 64 << 10
	recvSlots   = 16
)

func helperMain(in io.Reader, out io.Writer) error {
	p, err := New(Options{})
	if err != nil {
		return err
	}
	ctx, err := p.Open("soft0")
	if err != nil {
		return err
	}
	pd, _ := ctx.AllocPD()
	scq, _ := ctx.CreateCQ(1024)
	rcq, _ := ctx.CreateCQ(1024)
	q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 64, MaxRecvWR: recvSlots, MaxSendSGE: 4, MaxRecvSGE: 4})
	if err != nil {
		return err
	}
	buf, err := verbs.AllocBuffer(helperMRLen)
	if err != nil {
		return err
	}
	mr, err := pd.RegMR(buf.Bytes(), allRemote)
	if err != nil {
		return err
	}
	rb, _ := verbs.AllocBuffer(recvSlot * recvSlots)
	rmr, err := pd.RegMR(rb.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	port := ctx.Info().Ports[0]
	ep := verbs.Endpoint{QPNum: q.Num(), PSN: 4242, GID: port.GID, Port: 1, MTU: port.MTU}
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", a...)
	}
	hb, _ := json.Marshal(helperHello{EP: ep, Addr: mr.Addr(), RKey: mr.RKey(), Len: helperMRLen, RecvLen: recvSlot})
	say("%s", hb)
	sc := bufio.NewScanner(in)
	if !sc.Scan() {
		return fmt.Errorf("no peer endpoint")
	}
	var peer verbs.Endpoint
	if err := json.Unmarshal(sc.Bytes(), &peer); err != nil {
		return err
	}
	if err := verbs.Connect(q, 1, allRemote, ep, peer, verbs.Path{}); err != nil {
		return err
	}
	go func() { // report every receive completion
		for {
			wc, err := verbs.PollOne(context.Background(), rcq)
			if err != nil {
				return
			}
			crc := uint32(0)
			if wc.Status == verbs.StatusSuccess && wc.Opcode == verbs.WCRecv {
				crc = crc32.ChecksumIEEE(rb.Bytes()[int(wc.ID)*recvSlot : int(wc.ID)*recvSlot+int(wc.ByteLen)])
			}
			say("wc %d %d %d %d %d %t %d", wc.ID, wc.Status, wc.Opcode, wc.ByteLen, wc.Imm, wc.HasImm, crc)
		}
	}()
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		arg := func(i int) int { v, _ := strconv.Atoi(f[i]); return v }
		switch f[0] {
		case "recv": // recv slot...: post one receive per slot
			for i := 1; i < len(f); i++ {
				s := arg(i)
				if _, err := q.PostRecv([]verbs.RecvWR{{ID: uint64(s), SGL: []verbs.SGE{verbs.SGEOf(rmr, s*recvSlot, recvSlot)}}}); err != nil {
					return err
				}
			}
			say("ok")
		case "crc": // crc off len
			say("crc %d", crc32.ChecksumIEEE(buf.Bytes()[arg(1):arg(1)+arg(2)]))
		case "fill": // fill off len seed
			fill(buf.Bytes()[arg(1):arg(1)+arg(2)], uint64(arg(3)))
			say("ok")
		case "state":
			say("state %s", q.State())
		}
	}
	return nil
}

type helper struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	hello helperHello
	wcs   chan string
	lines chan string
}

func startHelper(t *testing.T, local verbs.Endpoint) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{t: t, cmd: cmd, stdin: stdin, wcs: make(chan string, 100), lines: make(chan string, 100)}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	first := make(chan string, 1)
	go func() {
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "wc ") {
				h.wcs <- l
			} else {
				h.lines <- l
			}
		}
		close(h.lines)
	}()
	select {
	case l, ok := <-first:
		if !ok {
			t.Fatal("helper exited before its hello")
		}
		if err := json.Unmarshal([]byte(l), &h.hello); err != nil {
			t.Fatalf("helper hello %q: %v", l, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no hello from the helper")
	}
	b, _ := json.Marshal(local)
	fmt.Fprintf(stdin, "%s\n", b)
	return h
}

func (h *helper) do(format string, a ...any) string {
	h.t.Helper()
	fmt.Fprintf(h.stdin, format+"\n", a...)
	select {
	case l, ok := <-h.lines:
		if !ok {
			h.t.Fatal("helper exited")
		}
		return l
	case <-time.After(30 * time.Second):
		h.t.Fatalf("helper did not answer %q", fmt.Sprintf(format, a...))
	}
	return ""
}

func (h *helper) wc() string {
	h.t.Helper()
	select {
	case l := <-h.wcs:
		return l
	case <-time.After(30 * time.Second):
		h.t.Fatal("no completion from the helper")
	}
	return ""
}

func crossPair(t *testing.T) (*node, *helper) {
	t.Helper()
	p, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, p, "soft0", nodeCfg{sendWR: 256})
	h := startHelper(t, a.ep)
	if err := verbs.Connect(a.qp, 1, allRemote, a.ep, h.hello.EP, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	return a, h
}

func TestCrossProcessDataPath(t *testing.T) {
	a, h := crossPair(t)
	src := a.reg(helperMRLen, verbs.AccessLocalWrite)
	fill(src.Bytes(), 11)

	// WRITE 1 B .. 4 MiB at odd offsets, some with several SGEs; check the helper's CRC.
	off := 0
	for i, n := range []int{1, 3, 4095, 4096, 65537, 1 << 20, 4 << 20} {
		var sgl []verbs.SGE
		if n > 3 {
			sgl = []verbs.SGE{verbs.SGEOf(src, 0, n/3), verbs.SGEOf(src, n/3, n-n/3)}
		} else {
			sgl = []verbs.SGE{verbs.SGEOf(src, 0, n)}
		}
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl, RemoteAddr: h.hello.Addr + uint64(off), RKey: h.hello.RKey})
		expectWC(t, a.scq, uint64(i), verbs.StatusSuccess)
		want := fmt.Sprintf("crc %d", crc32.ChecksumIEEE(src.Bytes()[:n]))
		if got := h.do("crc %d %d", off, n); got != want {
			t.Fatalf("WRITE of %d bytes: helper has %s, want %s", n, got, want)
		}
		off += 7
	}

	// READ what the helper filled.
	h.do("fill %d %d %d", 100, 3<<20, 99)
	dst := a.reg(3<<20, verbs.AccessLocalWrite)
	a.post(verbs.SendWR{ID: 50, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(dst, 0, 1<<20), verbs.SGEOf(dst, 1<<20, 2<<20)}, RemoteAddr: h.hello.Addr + 100, RKey: h.hello.RKey})
	expectWC(t, a.scq, 50, verbs.StatusSuccess)
	if got, want := fmt.Sprintf("crc %d", crc32.ChecksumIEEE(dst.Bytes())), h.do("crc 100 %d", 3<<20); got != want {
		t.Fatalf("READ: %s, helper has %s", got, want)
	}

	// Unsignaled WRITEs, then WRITE_WITH_IMM and SEND: the helper's receive completions
	// carry the immediate and the SEND's bytes, and the WRITEs are in place by then.
	h.do("recv 0 1")
	var wrs []verbs.SendWR
	for i := range 32 {
		wrs = append(wrs, verbs.SendWR{ID: uint64(100 + i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(src, i*65536, 65536)}, RemoteAddr: h.hello.Addr + uint64(i*65536), RKey: h.hello.RKey})
	}
	wrs = append(wrs,
		verbs.SendWR{ID: 200, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 10)}, RemoteAddr: h.hello.Addr, RKey: h.hello.RKey, Imm: 0xabcdef01},
		verbs.SendWR{ID: 201, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 5, 30000)}})
	a.post(wrs...)
	expectWC(t, a.scq, 200, verbs.StatusSuccess)
	expectWC(t, a.scq, 201, verbs.StatusSuccess)
	if got, want := h.wc(), fmt.Sprintf("wc 0 0 %d 10 %d true 0", verbs.WCRecvWithImm, 0xabcdef01); got != want {
		t.Fatalf("helper completion %q, want %q", got, want)
	}
	if got, want := h.wc(), fmt.Sprintf("wc 1 0 %d 30000 0 false %d", verbs.WCRecv, crc32.ChecksumIEEE(src.Bytes()[5:30005])); got != want {
		t.Fatalf("helper completion %q, want %q", got, want)
	}
	if got, want := h.do("crc 0 %d", 32*65536), fmt.Sprintf("crc %d", crc32.ChecksumIEEE(src.Bytes()[:32*65536])); got != want {
		t.Fatalf("unsignaled WRITEs: helper has %s, want %s", got, want)
	}
}

func TestCrossProcessAccessError(t *testing.T) {
	a, h := crossPair(t)
	src := a.reg(4096, verbs.AccessLocalWrite)
	fill(src.Bytes(), 3)
	h.do("recv 0")
	a.post(
		verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 4096)}, RemoteAddr: h.hello.Addr + helperMRLen - 100, RKey: h.hello.RKey},
		verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 4096)}, RemoteAddr: h.hello.Addr, RKey: h.hello.RKey},
	)
	expectWC(t, a.scq, 1, verbs.StatusRemAccessErr)
	expectWC(t, a.scq, 2, verbs.StatusWRFlushErr)
	// The helper's QP went to ERR and flushed its receive; its memory is untouched.
	if got, want := h.wc(), fmt.Sprintf("wc 0 %d %d 0 0 false 0", verbs.StatusWRFlushErr, verbs.WCRecv); got != want {
		t.Fatalf("helper completion %q, want %q", got, want)
	}
	if got := h.do("state"); got != "state ERR" {
		t.Fatalf("helper %s", got)
	}
	if got, want := h.do("crc 0 %d", helperMRLen), fmt.Sprintf("crc %d", crc32.ChecksumIEEE(make([]byte, helperMRLen))); got != want {
		t.Fatal("a refused WRITE changed the helper's memory")
	}
}

// SIGKILL of the remote process with work queued: the WR in flight fails with transport
// retry exceeded, the rest flush, and nothing waits past the deadline.
func TestCrossProcessPeerKilled(t *testing.T) {
	a, h := crossPair(t)
	src := a.reg(1<<20, verbs.AccessLocalWrite)
	rbuf := a.reg(64, verbs.AccessLocalWrite)
	a.postRecv(verbs.RecvWR{ID: 9, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
	// Prove the connection works, then queue SENDs the helper has no receives for (they wait
	// in its RNR timer) and kill it.
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 1<<20)}, RemoteAddr: h.hello.Addr, RKey: h.hello.RKey})
	expectWC(t, a.scq, 1, verbs.StatusSuccess)
	for i := range 8 {
		a.post(verbs.SendWR{ID: uint64(10 + i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 100)}})
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	expectWC(t, a.scq, 10, verbs.StatusRetryExcErr)
	for i := 1; i < 8; i++ {
		expectWC(t, a.scq, uint64(10+i), verbs.StatusWRFlushErr)
	}
	expectWC(t, a.rcq, 9, verbs.StatusWRFlushErr)
	if s := a.qp.State(); s != verbs.QPErr {
		t.Fatalf("qp %s after the peer died", s)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("peer death noticed after %v", d)
	}
}
