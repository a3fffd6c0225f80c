package railset

import (
	"testing"
	"time"
)

func TestRefusalBackoff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b refusalBackoff
	if b.active(t0) {
		t.Fatal("active before any refusal")
	}
	steps := []struct {
		base, bound time.Duration
		want        time.Duration
	}{
		{time.Second, 5 * time.Second, time.Second},
		{time.Second, 5 * time.Second, 2 * time.Second},
		{time.Second, 5 * time.Second, 4 * time.Second},
		{time.Second, 5 * time.Second, 5 * time.Second}, // bounded
		{time.Second, 5 * time.Second, 5 * time.Second},
	}
	now := t0
	for i, s := range steps {
		if d := b.fail(now, s.base, s.bound); d != s.want {
			t.Fatalf("refusal %d: hold-off %v, want %v", i+1, d, s.want)
		}
		if !b.active(now.Add(s.want-time.Nanosecond)) || b.active(now.Add(s.want)) {
			t.Fatalf("refusal %d: active window is not [now, now+%v)", i+1, s.want)
		}
		now = now.Add(s.want)
	}
	if b.n != len(steps) {
		t.Fatalf("%d refusals counted, want %d", b.n, len(steps))
	}
	b.ok()
	if b.active(now) || b.fail(now, time.Second, 5*time.Second) != time.Second {
		t.Fatal("a success does not reset the backoff")
	}
	var d refusalBackoff
	if got := d.fail(t0, 0, 0); got != defaultRefusalBackoff {
		t.Fatalf("default base %v", got)
	}
}
