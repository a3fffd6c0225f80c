package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/secure/securetest"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// pki is one test's certificate material on disk: a CA, a server certificate for
// 127.0.0.1 and the broken variants the refusal tests need.
type pki struct {
	dir                       string
	ca, otherCA               string // CA files
	srvCert, srvKey           string // valid, for 127.0.0.1
	expCert, expKey           string // expired
	badNameCert, badNameKey   string // valid, for another host
	cliCert, cliKey           string // client certificate from ca
	alienCliCert, alienCliKey string // client certificate from otherCA
	caObj                     *securetest.CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ca, err := securetest.NewCA("dfkv test CA")
	must(err)
	other, err := securetest.NewCA("someone else's CA")
	must(err)
	p.caObj = ca
	p.ca, err = ca.WriteCA(p.dir, "ca")
	must(err)
	p.otherCA, err = other.WriteCA(p.dir, "other-ca")
	must(err)
	issue := func(from *securetest.CA, name string, o securetest.LeafOptions) (string, string) {
		l, err := from.Issue(name, o)
		must(err)
		c, k, err := l.Write(p.dir, name)
		must(err)
		return c, k
	}
	p.srvCert, p.srvKey = issue(ca, "server", securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
	p.expCert, p.expKey = issue(ca, "expired", securetest.LeafOptions{Hosts: []string{"127.0.0.1"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	p.badNameCert, p.badNameKey = issue(ca, "badname", securetest.LeafOptions{Hosts: []string{"cache.example.com", "10.9.8.7"}})
	p.cliCert, p.cliKey = issue(ca, "client", securetest.LeafOptions{Client: true})
	p.alienCliCert, p.alienCliKey = issue(other, "alien-client", securetest.LeafOptions{Client: true})
	return p
}

func tlsConfig(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	cfg, err := client.TLSFromFiles(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientWith(t *testing.T, addr string, o client.Options) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	o.Membership = ms
	if o.Namespace == nil {
		o.Namespace = []byte("sec")
	}
	o.ConnectTimeout, o.IOTimeout, o.Cooldown = 2*time.Second, 5*time.Second, time.Millisecond
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refusedFast runs op and wants an error within bound (no hang).
func refusedFast(t *testing.T, what string, bound time.Duration, op func() error) error {
	t.Helper()
	start := time.Now()
	err := op()
	if err == nil {
		t.Fatalf("%s: succeeded, want refusal", what)
	}
	if d := time.Since(start); d > bound {
		t.Fatalf("%s: refusal took %v (> %v): %v", what, d, bound, err)
	}
	return err
}

func TestTLSPlaintextMismatchFailsFast(t *testing.T) {
	p := newPKI(t)
	tlsSrv := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.srvCert, "--tls-key", p.srvKey)
	plainSrv := startServer(t, t.TempDir(), "--cap", "64MiB")

	ok := clientWith(t, tlsSrv.addr, client.Options{TLS: tlsConfig(t, p.ca, "", "")})
	if err := ok.Put(context.Background(), []byte("k"), []byte("over tls")); err != nil {
		t.Fatalf("tls client to tls server: %v", err)
	}
	buf := make([]byte, 8)
	if err := ok.Get(context.Background(), []byte("k"), buf); err != nil || string(buf) != "over tls" {
		t.Fatalf("tls get: %q %v", buf, err)
	}
	plain := clientWith(t, tlsSrv.addr, client.Options{})
	refusedFast(t, "plaintext client -> tls server", 3*time.Second, func() error { return plain.Put(context.Background(), []byte("k"), []byte("x")) })
	tlsToPlain := clientWith(t, plainSrv.addr, client.Options{TLS: tlsConfig(t, p.ca, "", "")})
	refusedFast(t, "tls client -> plaintext server", 3*time.Second, func() error { return tlsToPlain.Put(context.Background(), []byte("k"), []byte("x")) })
	// The TLS server still serves after the plaintext attempt, and kept the value.
	if err := ok.Get(context.Background(), []byte("k"), buf); err != nil || string(buf) != "over tls" {
		t.Fatalf("tls server after plaintext attempt: %q %v", buf, err)
	}
}

func TestTLSRefusals(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.srvCert, "--tls-key", p.srvKey)
	expired := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.expCert, "--tls-key", p.expKey)
	badName := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.badNameCert, "--tls-key", p.badNameKey)
	mtls := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.srvCert, "--tls-key", p.srvKey,
		"--tls-ca", p.ca, "--tls-client-auth", "require")
	for _, tc := range []struct {
		name, addr string
		cfg        *tls.Config
		want       string // in the error text
	}{
		{"wrong CA", srv.addr, tlsConfig(t, p.otherCA, "", ""), "unknown authority"},
		{"expired certificate", expired.addr, tlsConfig(t, p.ca, "", ""), "expired"},
		{"wrong server name", badName.addr, tlsConfig(t, p.ca, "", ""), "127.0.0.1"},
		// TLS 1.3 clients finish their side of the handshake before the server checks their
		// certificate, so the refusal surfaces as the server's alert or a closed socket on
		// the HELLO that follows: still ErrUnavailable, at once.
		{"mTLS without a client certificate", mtls.addr, tlsConfig(t, p.ca, "", ""), ""},
		{"mTLS with another CA's client certificate", mtls.addr, tlsConfig(t, p.ca, p.alienCliCert, p.alienCliKey), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clientWith(t, tc.addr, client.Options{TLS: tc.cfg})
			err := refusedFast(t, tc.name, 3*time.Second, func() error { return c.Put(context.Background(), []byte("k"), []byte("v")) })
			if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: %v (want ErrUnavailable mentioning %q)", tc.name, err, tc.want)
			}
		})
	}
	good := clientWith(t, mtls.addr, client.Options{TLS: tlsConfig(t, p.ca, p.cliCert, p.cliKey)})
	if err := good.Put(context.Background(), []byte("k"), []byte("mtls ok")); err != nil {
		t.Fatalf("mTLS with a good client certificate: %v", err)
	}
	// dfkvctl speaks mTLS with flags, and its env twins.
	if out := ctl(t, "--node", mtls.addr, "--ns", "sec", "--tls-ca", p.ca, "--tls-cert", p.cliCert, "--tls-key", p.cliKey, "exist", "k"); !strings.Contains(out, "7") {
		t.Fatalf("dfkvctl exist over mTLS: %q", out)
	}
	cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), "--node", mtls.addr, "--tls-ca", p.ca, "exist", "k")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("dfkvctl without a client certificate succeeded: %s", out)
	}
}

// peerCN dials addr and returns the CommonName of the certificate the server presents.
func peerCN(t *testing.T, addr, ca string) string {
	t.Helper()
	d := &net.Dialer{Timeout: 2 * time.Second}
	cfg := tlsConfig(t, ca, "", "").Clone()
	cfg.ServerName = "127.0.0.1"
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func TestTLSCertificateRotation(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "live.crt"), filepath.Join(dir, "live.key")
	rotate := func(cn string) {
		l, err := p.caObj.Issue(cn, securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		// key first: a reload between the two renames fails the key check and keeps the old pair.
		if err := securetest.WriteAtomic(key, l.KeyPEM); err != nil {
			t.Fatal(err)
		}
		if err := securetest.WriteAtomic(cert, l.CertPEM); err != nil {
			t.Fatal(err)
		}
	}
	rotate("generation-1")
	srv := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", cert, "--tls-key", key,
		"--security-reload-interval", "100ms")
	if cn := peerCN(t, srv.addr, p.ca); cn != "generation-1" {
		t.Fatalf("first certificate: %s", cn)
	}
	c := clientWith(t, srv.addr, client.Options{TLS: tlsConfig(t, p.ca, "", "")})
	if err := c.Put(context.Background(), []byte("k"), []byte("before rotation")); err != nil {
		t.Fatal(err)
	}
	// File change, no signal: picked up by the watcher.
	rotate("generation-2")
	waitFor(t, 10*time.Second, "rotated certificate served", func() bool { return peerCN(t, srv.addr, p.ca) == "generation-2" })
	// SIGHUP: picked up at once (the watcher interval is long here, so the signal is what acts).
	srv2 := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", cert, "--tls-key", key,
		"--security-reload-interval", "1h")
	rotate("generation-3")
	if cn := peerCN(t, srv2.addr, p.ca); cn != "generation-2" {
		t.Fatalf("before SIGHUP: %s", cn)
	}
	if err := srv2.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "certificate reloaded on SIGHUP", func() bool { return peerCN(t, srv2.addr, p.ca) == "generation-3" })
	// The connection opened before the rotation was not dropped: the pooled one still works.
	before := c.Snapshot()
	buf := make([]byte, len("before rotation"))
	if err := c.Get(context.Background(), []byte("k"), buf); err != nil || string(buf) != "before rotation" {
		t.Fatalf("get after rotation: %q %v", buf, err)
	}
	if metricLine(before, "dfkv_client_dials_total") != "dfkv_client_dials_total 1" {
		t.Fatalf("before the get: %q, want one dial", metricLine(before, "dfkv_client_dials_total"))
	}
	if dials := metricLine(c.Snapshot(), "dfkv_client_dials_total"); dials != metricLine(before, "dfkv_client_dials_total") {
		t.Fatalf("the client redialed after rotation (%s -> %s): the old connection was dropped", metricLine(before, "dfkv_client_dials_total"), dials)
	}
}

func metricLine(snap []byte, name string) string {
	for _, l := range strings.Split(string(snap), "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			return l
		}
	}
	return ""
}

const tokenFile = `# test tokens
tok-a  read,write,remove  tenant-a
tok-b  read,write,remove  tenant-b
tok-ro read               tenant-a
tok-admin admin,all       *
`

func writeTokens(t *testing.T, path, content string) {
	t.Helper()
	if err := securetest.WriteAtomic(path, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

func TestTenantTokens(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	writeTokens(t, tokens, tokenFile)
	srv := startServer(t, t.TempDir(), "--cap", "64MiB", "--auth-tokens", tokens, "--security-reload-interval", "1h")
	tenant := func(tn, tok string) *client.Client {
		return clientWith(t, srv.addr, client.Options{Tenant: []byte(tn), Token: tok})
	}
	a, b := tenant("tenant-a", "tok-a"), tenant("tenant-b", "tok-b")
	key, val := []byte("shared-key"), []byte("tenant b's private prompt KV")
	if err := b.Put(context.Background(), key, val); err != nil {
		t.Fatalf("b puts its own key: %v", err)
	}
	if err := a.Put(context.Background(), []byte("a-key"), []byte("tenant a")); err != nil {
		t.Fatalf("a puts its own key: %v", err)
	}
	// Tenant A's token presenting tenant B's id: every op is Forbidden.
	intruder := tenant("tenant-b", "tok-a")
	buf := make([]byte, len(val))
	checks := map[string]func() error{
		"GET":    func() error { return intruder.Get(context.Background(), key, buf) },
		"EXIST":  func() error { _, err := intruder.Exist(context.Background(), key); return err },
		"PUT":    func() error { return intruder.Put(context.Background(), key, []byte("overwritten")) },
		"REMOVE": func() error { return intruder.Remove(context.Background(), key) },
		"BATCH_GET": func() error {
			items := []client.Item{{Key: key, Buf: make([]byte, len(val))}}
			if err := intruder.BatchGet(context.Background(), items, client.Exact); err != nil {
				return err
			}
			return items[0].Err
		},
		"BATCH_PUT": func() error {
			items := []client.Item{{Key: key, Value: []byte("overwritten")}}
			if err := intruder.BatchPut(context.Background(), items); err != nil {
				return err
			}
			return items[0].Err
		},
		"BATCH_REMOVE": func() error {
			items := []client.Item{{Key: key}}
			if err := intruder.BatchRemove(context.Background(), items); err != nil {
				return err
			}
			return items[0].Err
		},
	}
	for op, f := range checks {
		if err := f(); !errors.Is(err, client.ErrForbidden) {
			t.Errorf("tenant A's token on tenant B's key, %s: %v, want ErrForbidden", op, err)
		}
	}
	// Nothing changed: B still reads its value, byte for byte.
	got := make([]byte, len(val))
	if err := b.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("tenant B's value after the attempts: %q %v", got, err)
	}
	// The forbidden requests left the connection usable (payloads skipped in sync).
	if err := intruder.Ping(context.Background(), srv.addr); err != nil {
		t.Fatalf("ping after forbidden ops: %v", err)
	}
	// Rights are per op: a read-only token reads but cannot write or remove.
	ro := tenant("tenant-a", "tok-ro")
	if err := ro.Get(context.Background(), []byte("a-key"), make([]byte, len("tenant a"))); err != nil {
		t.Fatalf("read-only get: %v", err)
	}
	if err := ro.Put(context.Background(), []byte("a-key"), []byte("x")); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("read-only put: %v", err)
	}
	if err := ro.Remove(context.Background(), []byte("a-key")); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("read-only remove: %v", err)
	}
	// No token / a wrong token: refused at HELLO, fast, with Forbidden.
	for name, tok := range map[string]string{"no token": "", "unknown token": "tok-c", "prefix of a token": "tok-"} {
		c := tenant("tenant-a", tok)
		err := refusedFast(t, name, 3*time.Second, func() error { return c.Put(context.Background(), []byte("a-key"), []byte("x")) })
		if !errors.Is(err, client.ErrForbidden) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// dfkvctl: --token and --tenant; the wrong tenant exits 2 saying forbidden.
	ctl(t, "--node", srv.addr, "--ns", "sec", "--tenant", "tenant-a", "--token", "tok-a", "exist", "a-key")
	cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), "--node", srv.addr, "--ns", "sec", "--tenant", "tenant-b", "exist", "shared-key")
	cmd.Env = append(os.Environ(), "DFKV_TOKEN=tok-a")
	if out, err := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "forbidden") {
		t.Fatalf("dfkvctl with tenant A's token on tenant B: %v %s", err, out)
	}
	// STATS is an admin view.
	if _, err := a.NodeStats(context.Background(), srv.addr); err == nil {
		t.Fatal("tenant token read node stats")
	}
	if _, err := tenant("tenant-a", "tok-admin").NodeStats(context.Background(), srv.addr); err != nil {
		t.Fatalf("admin stats: %v", err)
	}
	// An old client (one that sends no token and knows no Forbidden status) gets a reply,
	// not a hang: a raw GET before any HELLO is answered Forbidden at once.
	nc, err := net.DialTimeout("tcp", srv.addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var req [wire.RequestSize]byte
	(&wire.Request{Op: fb.OpGet, Length: 4}).Encode(req[:])
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := nc.Write(req[:]); err != nil {
		t.Fatal(err)
	}
	var rb [wire.ResponseSize]byte
	if _, err := io.ReadFull(nc, rb[:]); err != nil {
		t.Fatalf("raw get without hello: %v", err)
	}
	if r, err := wire.DecodeResponse(rb[:]); err != nil || r.Status != fb.StatusForbidden {
		t.Fatalf("raw get without hello: %+v %v", r, err)
	}

	// Revocation: tok-a leaves the file; after SIGHUP the open (pooled) connection and new
	// ones are refused, while B is unaffected.
	writeTokens(t, tokens, strings.Replace(tokenFile, "tok-a  read,write,remove  tenant-a\n", "", 1))
	if err := a.Get(context.Background(), []byte("a-key"), make([]byte, len("tenant a"))); err != nil {
		t.Fatalf("before reload the token still works: %v", err)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "revoked token refused", func() bool {
		return errors.Is(a.Get(context.Background(), []byte("a-key"), make([]byte, len("tenant a"))), client.ErrForbidden)
	})
	if err := tenant("tenant-a", "tok-a").Put(context.Background(), []byte("a-key"), []byte("x")); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("revoked token on a new connection: %v", err)
	}
	if err := b.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("tenant B after the reload: %v", err)
	}
	if strings.Contains(srv.log.String(), "tok-") {
		t.Fatalf("a token appears in the server log:\n%s", srv.log)
	}
}

// TestGarbageHandshakesEveryPort: garbage and truncated TLS handshakes on the data, MDS and
// metrics ports are dropped within the first-request deadline and others keep being served.
func TestGarbageHandshakesEveryPort(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.srvCert, "--tls-key", p.srvKey, "--first-req-ms", "1500")
	m := startTLSMDS(t, p, "--first-req-ms", "1500")
	good := clientWith(t, srv.addr, client.Options{TLS: tlsConfig(t, p.ca, "", "")})
	https := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(t, p.ca, "", "")}}
	ports := map[string]string{"data": srv.addr, "mds": m.addr, "metrics (server)": srv.metricsAddr, "metrics (mds)": m.metricsAddr}
	// A real ClientHello, cut short: the start of what a TLS client sends.
	hello := clientHelloPrefix(t)
	for name, addr := range ports {
		var held []net.Conn
		for i, junk := range [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n"), bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff}, 64), hello[:len(hello)/2], hello[:5], {}} {
			nc, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Fatalf("%s: dial %d: %v", name, i, err)
			}
			_, _ = nc.Write(junk)
			held = append(held, nc) // left open: the server must not wait on them
		}
		// Meanwhile the port serves a real client.
		if err := good.Put(context.Background(), []byte("k-"+name), []byte("served")); err != nil {
			t.Fatalf("%s: data port stopped serving: %v", name, err)
		}
		resp, err := https.Get("https://" + srv.metricsAddr + "/healthz")
		if err != nil {
			t.Fatalf("%s: metrics stopped serving: %v", name, err)
		}
		resp.Body.Close()
		if _, err := mdsList(t, p, m.addr, "tok-admin"); err != nil {
			t.Fatalf("%s: mds stopped serving: %v", name, err)
		}
		// Every junk connection is closed by the server within the deadline (no hang).
		for i, nc := range held {
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.Copy(io.Discard, nc)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%s: junk connection %d still open after the first-request deadline", name, i)
			}
			nc.Close()
		}
	}
}

// clientHelloPrefix captures the first bytes a TLS 1.3 client sends.
func clientHelloPrefix(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = c.Handshake()
		a.Close()
	}()
	buf := make([]byte, 4096)
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := b.Read(buf)
	b.Close()
	if err != nil || n < 10 {
		t.Fatalf("capturing a client hello: %d %v", n, err)
	}
	return buf[:n]
}

// startTLSMDS runs dfkv_mds with TLS on its port and metrics, the test tokens, and an
// embedded etcd; it waits for the bound address.
func startTLSMDS(t *testing.T, p *pki, extra ...string) *mdsProc {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	writeTokens(t, tokens, tokenFile)
	mport := freePort(t)
	addrFile := filepath.Join(dir, "addr")
	m := &mdsProc{t: t, name: "mds-tls", metricsAddr: fmt.Sprintf("127.0.0.1:%d", mport)}
	m.args = append([]string{"--host", "127.0.0.1", "--listen", "0", "--addr-file", addrFile, "--metrics-port", strconv.Itoa(mport),
		"--etcd", "embedded:" + filepath.Join(dir, "etcd"), "--etcd-client-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--etcd-peer-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--lease-ttl", mdsTTL.String(), "--log-level", "warn",
		"--tls-cert", p.srvCert, "--tls-key", p.srvKey, "--auth-tokens", tokens}, extra...)
	m.cmd = exec.Command(filepath.Join(binDir, "dfkv_mds"), m.args...)
	m.log = &lockedWriter{w: &strings.Builder{}}
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(m.cmd, m.exited)
	t.Cleanup(m.kill)
	waitFor(t, 60*time.Second, "dfkv_mds (tls) listening", func() bool {
		select {
		case err := <-m.exited:
			t.Fatalf("dfkv_mds exited at start: %v\n%s", err, m.log)
		default:
		}
		b, err := os.ReadFile(addrFile)
		if err == nil && len(b) > 0 {
			m.addr = strings.TrimSpace(string(b))
			return true
		}
		return false
	})
	return m
}

func mdsRPC(t *testing.T, p *pki, addr, token string) *mdsclient.Client {
	t.Helper()
	c, err := mdsclient.New([]string{addr}, mdsclient.Options{CallTimeout: 3 * time.Second, TLS: tlsConfig(t, p.ca, "", ""), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mdsList(t *testing.T, p *pki, addr, token string) (*wire.MdsResponse, error) {
	resp, _, err := mdsRPC(t, p, addr, token).Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListClients, Group: mdsGroup})
	return resp, err
}

func TestMDSTLSAndTokens(t *testing.T) {
	p := newPKI(t)
	m := startTLSMDS(t, p)
	ctx := context.Background()
	member := &wire.Member{ID: "intruder", Addr: "127.0.0.1:1", Weight: 1, Eligible: true}
	// A tenant token cannot register a member or read the client list; no token cannot even
	// read the topology.
	for _, tc := range []struct {
		name, token string
		req         wire.MdsRequest
	}{
		{"register member with a tenant token", "tok-a", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: mdsGroup, Member: member}},
		{"client list with a tenant token", "tok-a", wire.MdsRequest{Op: fb.MdsOpListClients, Group: mdsGroup}},
		{"topology without a token", "", wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup}},
		{"register member with an unknown token", "tok-zzz", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: mdsGroup, Member: member}},
	} {
		if _, _, err := mdsRPC(t, p, m.addr, tc.token).Call(ctx, &tc.req); !errors.Is(err, mdsclient.ErrForbidden) {
			t.Errorf("%s: %v, want ErrForbidden", tc.name, err)
		}
	}
	if _, _, err := mdsRPC(t, p, m.addr, "tok-a").Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup}); err != nil {
		t.Fatalf("topology with a tenant token: %v", err)
	}
	// Plaintext to the TLS MDS fails fast.
	plain, err := mdsclient.New([]string{m.addr}, mdsclient.Options{CallTimeout: 3 * time.Second, Token: "tok-admin"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	refusedFast(t, "plaintext mds call", 4*time.Second, func() error {
		_, _, err := plain.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup})
		return err
	})

	// A node registers over TLS with the admin token; a client finds it through the MDS
	// (TLS + tenant token) and reaches it over TLS with its tenant token.
	dir := t.TempDir()
	adminTok := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(adminTok, []byte("tok-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeTokens := filepath.Join(dir, "node-tokens")
	writeTokens(t, nodeTokens, tokenFile)
	node := startServer(t, t.TempDir(), "--cap", "64MiB", "--tls-cert", p.srvCert, "--tls-key", p.srvKey, "--auth-tokens", nodeTokens,
		"--mds", m.addr, "--group", mdsGroup, "--id", "n1", "--advertise", "127.0.0.1:0",
		"--mds-tls-ca", p.ca, "--mds-token-file", adminTok)
	ms, err := client.NewMDSMembership(client.MDSOptions{Endpoints: []string{m.addr}, Group: mdsGroup, Poll: 200 * time.Millisecond,
		TLS: tlsConfig(t, p.ca, "", ""), Token: "tok-a"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "node registered through the TLS MDS", func() bool { return len(ms.View().Members) == 1 })
	c, err := client.New(client.Options{Membership: ms, Tenant: []byte("tenant-a"), Token: "tok-a", TLS: tlsConfig(t, p.ca, "", ""),
		IOTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(context.Background(), []byte("via-mds"), []byte("ok")); err != nil {
		t.Fatalf("put through MDS discovery over TLS: %v\nnode log:\n%s", err, node.log)
	}
	if resp, err := mdsList(t, p, m.addr, "tok-admin"); err != nil || resp == nil {
		t.Fatalf("admin client list: %v", err)
	}
	// dfkvctl's cluster views over TLS with tokens: the ring with a tenant token, the client
	// list and node stats with the admin token, the client list refused to a tenant token.
	if out := ctl(t, "ring", "--mds", m.addr, "--group", mdsGroup, "--json", "--tls-ca", p.ca, "--token", "tok-a"); !strings.Contains(out, `"n1"`) {
		t.Fatalf("dfkvctl ring over TLS: %s", out)
	}
	if out := ctl(t, "stat", "--all", "--mds", m.addr, "--group", mdsGroup, "--json", "--tls-ca", p.ca, "--token", "tok-admin"); !strings.Contains(out, "store_objects") {
		t.Fatalf("dfkvctl stat --all over TLS with the admin token: %s", out)
	}
	cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), "clients", "--mds", m.addr, "--group", mdsGroup, "--tls-ca", p.ca, "--token", "tok-a")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "forbidden") {
		t.Fatalf("dfkvctl clients with a tenant token: %v %s", err, out)
	}
}

// TestMDSMutualTLS: an MDS that requires client certificates accepts a node registering
// with --mds-tls-cert/--mds-tls-key and refuses a caller without one.
func TestMDSMutualTLS(t *testing.T) {
	p := newPKI(t)
	m := startTLSMDS(t, p, "--tls-ca", p.ca, "--tls-client-auth", "require")
	dir := t.TempDir()
	adminTok := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(adminTok, []byte("tok-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := startServer(t, t.TempDir(), "--cap", "64MiB", "--mds", m.addr, "--group", mdsGroup, "--id", "n1",
		"--advertise", "127.0.0.1:0", "--mds-tls-ca", p.ca, "--mds-tls-cert", p.cliCert, "--mds-tls-key", p.cliKey,
		"--mds-token-file", adminTok)
	withCert, err := mdsclient.New([]string{m.addr}, mdsclient.Options{CallTimeout: 3 * time.Second,
		TLS: tlsConfig(t, p.ca, p.cliCert, p.cliKey), Token: "tok-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer withCert.Close()
	waitFor(t, 20*time.Second, "node registered over mTLS", func() bool {
		resp, _, err := withCert.Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup})
		return err == nil && resp.Topology != nil && len(resp.Topology.Members) == 1
	})
	if _, _, err := mdsRPC(t, p, m.addr, "tok-a").Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup}); err == nil {
		t.Fatalf("an MDS requiring client certificates answered a caller without one\nnode log:\n%s", node.log)
	}
}

// TestMDSExternalEtcdTLS: dfkv_mds reaches an external etcd (Debian's etcd-server) that
// serves https and requires client certificates, with --etcd-cacert/--etcd-cert/--etcd-key;
// without the client certificate its calls answer the etcd-unavailable status.
func TestMDSExternalEtcdTLS(t *testing.T) {
	bin := etcdBinary(t)
	p := newPKI(t)
	client, peer := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "--name", "dfkv-e2e-tls", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", "https://"+client, "--advertise-client-urls", "https://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "dfkv-e2e-tls=http://"+peer, "--log-level", "error",
		"--cert-file", p.srvCert, "--key-file", p.srvKey, "--trusted-ca-file", p.ca, "--client-cert-auth")
	elog := &lockedWriter{w: &strings.Builder{}}
	cmd.Stdout, cmd.Stderr = elog, elog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	https := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(t, p.ca, p.cliCert, p.cliKey)}}
	waitFor(t, 30*time.Second, "etcd (https) healthy", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("etcd exited at start: %v\n%s", err, elog)
		default:
		}
		resp, err := https.Get("https://" + client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	good := startMDS(t, "mds-etcd-tls", []string{"--etcd", client, "--etcd-cacert", p.ca, "--etcd-cert", p.cliCert, "--etcd-key", p.cliKey})
	waitFor(t, 20*time.Second, "mds ready over etcd TLS", func() bool { return httpCode(good.metricsAddr, "/readyz") == 200 })
	noCert := startMDS(t, "mds-etcd-nocert", []string{"--etcd", client, "--etcd-cacert", p.ca})
	rpc, err := mdsclient.New([]string{noCert.addr}, mdsclient.Options{CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rpc.Close()
	if _, _, err := rpc.Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup}); !errors.Is(err, mdsclient.ErrBackend) {
		t.Fatalf("mds without the etcd client certificate: %v, want ErrBackend", err)
	}
	ok, err := mdsclient.New([]string{good.addr}, mdsclient.Options{CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	if _, _, err := ok.Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: mdsGroup}); err != nil {
		t.Fatalf("mds with the etcd client certificate: %v", err)
	}
}
