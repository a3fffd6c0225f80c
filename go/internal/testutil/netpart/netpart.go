//go:build linux

package netpart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ErrUnavailable is what Check wraps when this machine cannot make a namespace with rules:
// a test skips on it (or fails where CI must run it), a harness reports it.
var ErrUnavailable = errors.New("network partitions unavailable")

// cmdTimeout bounds each ip and nft call; they take milliseconds, the rest is a loaded machine.
const cmdTimeout = 10 * time.Second

// Check reports, wrapping ErrUnavailable, why this process cannot partition: not root, a
// tool missing from PATH, or no namespace with an nftables table to be had (a container
// without the capability).
func Check(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (a network namespace and nftables rules)", ErrUnavailable)
	}
	for _, bin := range []string{"unshare", "ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s not on PATH (apt-get install -y util-linux iproute2 nftables): %w", ErrUnavailable, bin, err)
		}
	}
	if err := run(ctx, "unshare", "--net", "--", "nft", "add", "table", "inet", "probe"); err != nil {
		return fmt.Errorf("%w: cannot create a network namespace with an nftables table: %w", ErrUnavailable, err)
	}
	return nil
}

// Command is name args run in a new network namespace with environment env (the caller
// passes its own, os.Environ() plus its marker that the child runs inside: a library
// package reads no environment). ctx bounds it: once ctx is done
// the child gets SIGTERM (unshare execs it, so the signal reaches it), then SIGKILL 10 s on.
func Command(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--net", "--", name}, args...)...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// Table is an nftables table of the current namespace with a filter chain on the input
// hook ("in") and one on the output hook ("out"), both empty until Drop.
type Table struct{ name string }

// Setup brings loopback up and creates the table. Call it inside the namespace Command
// made: a new namespace's loopback starts down.
func Setup(ctx context.Context, table string) (*Table, error) {
	if err := run(ctx, "ip", "link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	t := &Table{name: table}
	for _, r := range []string{"add table inet " + table,
		"add chain inet " + table + " in { type filter hook input priority 0 ; }",
		"add chain inet " + table + " out { type filter hook output priority 0 ; }"} {
		if err := run(ctx, "nft", r); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Drop adds rules (nft rule bodies such as "tcp dport 2379 drop"): in to the input chain,
// out to the output chain ("meta skuid 64100 drop" cuts all a uid sends).
func (t *Table) Drop(ctx context.Context, in, out []string) error {
	for _, r := range in {
		if err := run(ctx, "nft", "add rule inet "+t.name+" in "+r); err != nil {
			return err
		}
	}
	for _, r := range out {
		if err := run(ctx, "nft", "add rule inet "+t.name+" out "+r); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes every rule Drop added.
func (t *Table) Heal(ctx context.Context) error {
	if err := run(ctx, "nft", "flush chain inet "+t.name+" in"); err != nil {
		return err
	}
	return run(ctx, "nft", "flush chain inet "+t.name+" out")
}

// PortDrops are the rules that cut a TCP port both ways (what it receives and what it
// answers from), on the input chain.
func PortDrops(port string) []string {
	return []string{"tcp dport " + port + " drop", "tcp sport " + port + " drop"}
}

// EtcdStatus asks one etcd member (client address host:port) for its id and the leader it
// knows, through the v3 JSON gateway: the member to isolate is the leader.
func EtcdStatus(ctx context.Context, addr string) (id, leader string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v3/maintenance/status", strings.NewReader("{}"))
	if err != nil {
		return "", "", fmt.Errorf("status of %s: %w", addr, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("status of %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("status of %s: HTTP %d", addr, resp.StatusCode)
	}
	var st struct {
		Header struct {
			MemberID string `json:"member_id"`
		} `json:"header"`
		Leader string `json:"leader"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", "", fmt.Errorf("status of %s: %w", addr, err)
	}
	return st.Header.MemberID, st.Leader, nil
}

// run runs one short command under cmdTimeout, its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
