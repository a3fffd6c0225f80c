package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCProgram builds libdfkv.so and a real dfkv_server, compiles testdata/abi_test.c with
// gcc against the checked-in dfkv.h, and runs it against the server.
func TestCProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the shared library and a C program")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil && os.Getenv("DFKV_TEST_CABI_DIR") == "" {
		t.Fatal("gcc not found: the C ABI test needs a C compiler")
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = "../../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	// DFKV_TEST_CABI_DIR: libdfkv.so, dfkv_server and abi_test built already (the RDMA guest,
	// tools/rdma-vm, has no compilers); the program's rpath is $ORIGIN.
	bin := dir
	if pre := os.Getenv("DFKV_TEST_CABI_DIR"); pre != "" {
		bin = pre
	} else {
		run("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libdfkv.so"), "./go/cmd/libdfkv")
		run("go", "build", "-o", filepath.Join(dir, "dfkv_server"), "./go/cmd/server")
		run(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Igo/cmd/libdfkv", "-o", filepath.Join(dir, "abi_test"),
			"go/cmd/libdfkv/testdata/abi_test.c", "-L"+dir, "-ldfkv", "-Wl,-rpath,"+dir, "-pthread")
	}
	// The RDMA section runs over DFKV_TEST_RDMA_PROVIDER (default soft; ibverbs in the guest).
	provider := os.Getenv("DFKV_TEST_RDMA_PROVIDER")
	if provider == "" {
		provider = "soft"
	}

	addrFile := filepath.Join(dir, "addr")
	srv := exec.Command(filepath.Join(bin, "dfkv_server"), "--host", "127.0.0.1", "--port", "0", "--addr-file", addrFile,
		"--dir", filepath.Join(dir, "data"), "--cap", "256MiB", "--max-msg", "32MiB", "--log-level", "warn")
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	addr := waitAddr(t, addrFile)
	// A second server with RDMA over the soft provider (the software NIC: the C program's
	// process and the server's are the two hosts): the program's RDMA section.
	rdmaAddrFile := filepath.Join(dir, "rdma-addr")
	rsrv := exec.Command(filepath.Join(bin, "dfkv_server"), "--host", "127.0.0.1", "--port", "0", "--addr-file", rdmaAddrFile,
		"--dir", filepath.Join(dir, "rdma-data"), "--cap", "512MiB", "--max-msg", "64MiB", "--log-level", "warn",
		"--rdma", "--rdma-provider", provider, "--rdma-depth", "2", "--rdma-segment", "640MiB")
	rsrv.Stderr = os.Stderr
	if err := rsrv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rsrv.Process.Kill(); _ = rsrv.Wait() }()
	rdmaAddr := waitAddr(t, rdmaAddrFile)

	cmd := exec.Command(filepath.Join(bin, "abi_test"))
	cmd.Env = append(os.Environ(), "DFKV_TEST_ADDR="+addr, "DFKV_TEST_RDMA_ADDR="+rdmaAddr, "DFKV_RDMA_PROVIDER="+provider,
		"DFKV_RDMA_MAX_BLOCK="+strconv.Itoa(64<<20), "DFKV_RDMA_DEPTH=2", "DFKV_IO_TIMEOUT_MS=60000")
	if provider != "soft" {
		// The soft NIC maps any DMA-BUF itself and must take it; a real NIC may refuse
		// (rxe does, EOPNOTSUPP), and then the program checks the refusal instead.
		cmd.Env = append(cmd.Env, "DFKV_TEST_DMABUF_MAY_REFUSE=1")
	}
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("C ABI test program failed: %v", err)
	}
	last := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		last = sc.Text()
	}
	if strings.Contains(string(out), "rdma section not run") {
		t.Fatal("the C program's RDMA section did not run")
	}
	if !strings.HasSuffix(last, " 0 failed") || strings.HasPrefix(last, "0 passed") {
		t.Fatalf("unexpected summary %q", last)
	}
}

// waitAddr waits for a server's address file: 15 s, stretched by DFKV_TEST_FABRIC_SCALE
// (1..20, as in go/e2e) on a slow machine. Under emulation (tools/rdma-vm) registering a
// 640 MiB receive segment alone takes longer than 15 s.
func waitAddr(t *testing.T, path string) string {
	t.Helper()
	scale := 1
	if v := os.Getenv("DFKV_TEST_FABRIC_SCALE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 20 {
			t.Fatalf("DFKV_TEST_FABRIC_SCALE=%q: want 1..20", v)
		}
		scale = n
	}
	deadline := time.Now().Add(15 * time.Second * time.Duration(scale))
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return strings.TrimSpace(string(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server did not write its address")
	return ""
}
