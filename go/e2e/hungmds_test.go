package e2e

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/cabi"
)

// hungHoldBound: a replica that accepts and then never answers (SIGSTOP: the kernel still
// completes connects and takes requests) holds a client's long poll for at most its
// deadline, the default 10 s wait plus the 2 s call timeout, before the client asks the
// other replica. The slack is for a loaded machine.
const hungHoldBound = 12*time.Second + 2*time.Second

// TestMDSHungReplica: with the default configuration, a hung MDS replica listed first does
// not keep a client on its old ring past hungHoldBound: a node that joins right after the
// hang reaches the client through the other replica.
func TestMDSHungReplica(t *testing.T) {
	e := startEtcd(t, etcdBinary(t))
	a := startMDSDefaults(t, "mds-a", e.client)
	b := startMDSDefaults(t, "mds-b", e.client)
	eps := a.addr + "," + b.addr // a first: the replica everyone uses until it hangs
	startNode := func(id string) {
		s := startServer(t, t.TempDir(), "--cap", "32MiB", "--max-msg", "1MiB", "--mds", eps, "--group", "hung",
			"--id", id, "--advertise", "127.0.0.1:0")
		waitFor(t, 30*time.Second, id+" registered (/readyz)", func() bool { return s.httpStatus("/readyz") == 200 })
	}
	startNode("n1")
	startNode("n2")
	h := cabi.Open(&cabi.Options{StructSize: cabi.OptionsSize, ABIVersion: cabi.ABIVersion, Namespace: []byte("hung"),
		MDSEndpoints: eps, MDSGroup: "hung", Flags: cabi.FlagRegisterWithMDS, ClientID: "hung-client"})
	if h == 0 {
		t.Fatalf("open: %s", cabi.LastError())
	}
	t.Cleanup(func() { cabi.Close(h) })
	c := cabi.Lookup(h).Client()
	waitFor(t, 10*time.Second, "the client routes by two nodes", func() bool { return len(c.View().Members) == 2 })
	time.Sleep(500 * time.Millisecond) // the client's long poll is now held by a

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hung := time.Now()
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	startNode("n3") // registers through b once its call to a times out
	ready := time.Since(hung)
	for !slices.Contains(viewIDs(c.View()), "n3") {
		if time.Since(hung) > hungHoldBound {
			t.Fatalf("the client still routes by %v %v after its first MDS replica hung (n3 was ready after %v; bound %v)",
				viewIDs(c.View()), time.Since(hung).Round(time.Millisecond), ready.Round(time.Millisecond), hungHoldBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("n3 ready %v after the hang; in the client's ring %v after the hang (bound %v)",
		ready.Round(time.Millisecond), time.Since(hung).Round(time.Millisecond), hungHoldBound)
	// The client now follows through b: the next join is seen within the join bound, with
	// no second hold, while a stays hung.
	startNode("n4")
	joined := time.Now()
	waitFor(t, joinBound, "n4 in the client's ring through the other replica", func() bool { return slices.Contains(viewIDs(c.View()), "n4") })
	t.Logf("n4 in the client's ring %v after it was ready", time.Since(joined).Round(time.Millisecond))
}
