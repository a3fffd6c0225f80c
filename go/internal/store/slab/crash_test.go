//go:build linux

package slab

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
)

const crashChildEnv = "DFKV_SLAB_CRASH_CHILD_DIR"

// crashSize varies value sizes over a few classes.
func crashSize(i int) int { return 1000 + (i%5)*23000 }

// TestCrashChild is the writer half of TestKill9: it runs only inside the child process,
// writes values forever and prints "ack N" after each acknowledged Put.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("helper for TestKill9")
	}
	e, err := Open(testConfig(dir))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		if err := put(e, testKey(i), testValue(i, crashSize(i))); err != nil {
			fmt.Fprintln(w, "error:", err)
			w.Flush()
			os.Exit(3)
		}
		if i%7 == 3 { // some removes, acknowledged too
			if err := e.Remove(testKey(i - 1)); err != nil {
				fmt.Fprintln(w, "error:", err)
				w.Flush()
				os.Exit(3)
			}
			fmt.Fprintf(w, "rm %d\n", i-1)
		}
		fmt.Fprintf(w, "ack %d\n", i)
		w.Flush()
	}
}

// TestKill9 SIGKILLs a writer process mid-stream; after restart every key must be a miss
// or byte-exact, and acknowledged writes (not later removed or evicted) must be present.
func TestKill9(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip()
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// 100 values over five classes fit in the 8 extents without eviction, so every
	// acknowledged value must survive.
	const stopAfter = 100
	acked, removed := map[int]bool{}, map[int]bool{}
	last := -1
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		switch f[0] {
		case "ack":
			acked[n], last = true, n
		case "rm":
			removed[n] = true
		case "error:":
			t.Fatalf("child: %s", line)
		}
		if last >= stopAfter {
			break
		}
	}
	// Kill while the child is in the middle of its next writes.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if last < stopAfter {
		t.Fatalf("child stopped after %d acks", last+1)
	}

	e := mustOpen(t, testConfig(dir))
	if !e.UncleanStart() {
		t.Fatal("SIGKILL not detected as an unclean stop")
	}
	present, unacked := 0, 0
	for i := 0; i <= last+5; i++ {
		v, err := get(e, testKey(i))
		switch {
		case err == nil:
			present++
			if !bytes.Equal(v, testValue(i, crashSize(i))) {
				t.Fatalf("key %d: wrong bytes after crash", i)
			}
			if removed[i] {
				t.Fatalf("key %d: acknowledged Remove undone by the crash", i)
			}
		case errors.Is(err, store.ErrCorrupt):
			// A record durable before its payload (a Put in flight at the kill: the
			// payload write and the record's commit overlap) reads as a CRC miss; an
			// acknowledged Put had both durable, so it must never come to this.
			if acked[i] {
				t.Fatalf("acknowledged key %d: payload does not match its record after crash: %v", i, err)
			}
			unacked++
		case errors.Is(err, store.ErrNotFound):
			// The child removes key i-1 right after putting key i: a Remove of the last
			// acknowledged key may have happened after the last line read.
			mayBeRemoved := i == last && (i+1)%7 == 3
			if acked[i] && !removed[i] && !mayBeRemoved {
				t.Fatalf("acknowledged key %d lost after crash", i)
			}
		default:
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if present == 0 {
		t.Fatal("nothing survived the crash")
	}
	if s := e.Stats(); s.CorruptReads != int64(unacked) {
		t.Fatalf("CorruptReads=%d, but only %d unacknowledged keys read as CRC misses", s.CorruptReads, unacked)
	}
	// The engine keeps working on the recovered directory.
	mustPut(t, e, testKey(1<<20), testValue(1, 5000))
	mustGet(t, e, testKey(1<<20), testValue(1, 5000))
}
