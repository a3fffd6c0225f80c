package verbs

import (
	"errors"
	"testing"
)

func TestCheckTransition(t *testing.T) {
	all := []QPState{QPReset, QPInit, QPRTR, QPRTS, QPSQD, QPSQE, QPErr}
	allowed := map[[2]QPState]bool{
		{QPReset, QPInit}: true, {QPInit, QPInit}: true, {QPInit, QPRTR}: true,
		{QPRTR, QPRTS}: true, {QPRTS, QPRTS}: true,
	}
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]QPState{from, to}] || to == QPErr || to == QPReset
			err := CheckTransition(from, to)
			if (err == nil) != want {
				t.Errorf("%s -> %s: err=%v, want allowed=%v", from, to, err, want)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("%s -> %s: %v does not wrap ErrInvalid", from, to, err)
			}
		}
	}
}

func TestAllocBuffer(t *testing.T) {
	b, err := AllocBuffer(5000)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Bytes()) != 5000 {
		t.Fatalf("len %d", len(b.Bytes()))
	}
	for i, c := range b.Bytes() {
		if c != 0 {
			t.Fatalf("byte %d = %d, want zeroed memory", i, c)
		}
	}
	b.Bytes()[4999] = 7
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatalf("second Free: %v", err)
	}
	if _, err := AllocBuffer(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AllocBuffer(0) = %v, want ErrInvalid", err)
	}
}

func TestCompletionErr(t *testing.T) {
	if err := (WorkCompletion{Status: StatusSuccess}).Err(); err != nil {
		t.Fatal(err)
	}
	err := (WorkCompletion{ID: 9, QPNum: 3, Status: StatusRemAccessErr}).Err()
	var ce *CompletionError
	if !errors.As(err, &ce) || ce.WC.Status != StatusRemAccessErr {
		t.Fatalf("err = %v", err)
	}
	if got, want := err.Error(), "verbs: wr 9 on qp 3: remote access error"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

func TestGIDString(t *testing.T) {
	g := GID{0xfe, 0x80, 15: 1}
	if got := g.String(); got != "fe80:0:0:0:0:0:0:1" {
		t.Fatal(got)
	}
	if g.IsZero() || !(GID{}).IsZero() {
		t.Fatal("IsZero")
	}
}
