package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every millisecond until it holds, failing t when bound passes first.
// It stands in for an event the test cannot subscribe to, never for a fixed sleep.
func WaitFor(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", bound, what)
		}
		time.Sleep(time.Millisecond)
	}
}
