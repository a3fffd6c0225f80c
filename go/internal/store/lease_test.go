package store

import (
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
)

func TestLeases(t *testing.T) {
	k := func(i uint64) Key { return Key{ID: identity.ObjectID{Lo: i}} }
	type step struct {
		op   string // grant, release, advance, held
		key  uint64
		size int64
		ttl  time.Duration
		tag  string
		want bool
	}
	cases := []struct {
		name      string
		limit     int64
		steps     []step
		wantBytes int64
		wantHeld  map[string]bool // tag -> held according to onChange
	}{
		{"grant within the cap", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "held", key: 1, want: true},
		}, 60, map[string]bool{"a": true}},
		{"past the cap refused", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "grant", key: 2, size: 60, ttl: time.Second, tag: "b", want: false},
			{op: "held", key: 2, want: false},
		}, 60, map[string]bool{"a": true}},
		{"extension is not charged twice", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "grant", key: 1, size: 60, ttl: time.Minute, tag: "a", want: true},
			{op: "advance", ttl: 2 * time.Second},
			{op: "held", key: 1, want: true},
		}, 60, map[string]bool{"a": true}},
		{"retag moves the hold", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "grant", key: 1, size: 40, ttl: time.Second, tag: "b", want: true},
		}, 40, map[string]bool{"a": false, "b": true}},
		{"release frees budget", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "release", key: 1},
			{op: "grant", key: 2, size: 60, ttl: time.Second, tag: "b", want: true},
		}, 60, map[string]bool{"a": false, "b": true}},
		{"expiry frees budget at the next grant", 100, []step{
			{op: "grant", key: 1, size: 60, ttl: time.Second, tag: "a", want: true},
			{op: "advance", ttl: time.Second},
			{op: "grant", key: 2, size: 60, ttl: time.Second, tag: "b", want: true},
			{op: "held", key: 1, want: false},
		}, 60, map[string]bool{"a": false, "b": true}},
		{"expired lease not held", 100, []step{
			{op: "grant", key: 1, size: 10, ttl: time.Second, tag: "a", want: true},
			{op: "advance", ttl: 1001 * time.Millisecond},
			{op: "held", key: 1, want: false},
		}, 0, map[string]bool{"a": false}},
		{"zero budget never leases", 0, []step{
			{op: "grant", key: 1, size: 1, ttl: time.Second, tag: "a", want: false},
		}, 0, map[string]bool{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			held := map[string]bool{}
			l := NewLeases(c.limit, func(tag any, h bool) { held[tag.(string)] = h })
			now := time.Unix(1000, 0)
			l.SetClock(func() time.Time { return now })
			for i, s := range c.steps {
				switch s.op {
				case "grant":
					if got := l.Grant(k(s.key), s.size, s.ttl, s.tag); got != s.want {
						t.Fatalf("step %d: grant = %v, want %v", i, got, s.want)
					}
				case "release":
					l.Release(k(s.key))
				case "advance":
					now = now.Add(s.ttl)
				case "held":
					if got := l.Held(k(s.key)); got != s.want {
						t.Fatalf("step %d: held = %v, want %v", i, got, s.want)
					}
				}
			}
			if st := l.Stats(); st.ActiveBytes != c.wantBytes || st.LimitBytes != c.limit {
				t.Fatalf("stats %+v, want %d bytes", st, c.wantBytes)
			}
			for tag, want := range c.wantHeld {
				if held[tag] != want {
					t.Fatalf("tag %s held=%v, want %v (%v)", tag, held[tag], want, held)
				}
			}
		})
	}
}
