//go:build linux

package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/dfkv/dfkv/go/internal/secure/securetest"
)

// tlsTestCerts writes a throwaway CA (ca.crt), a server certificate for --hosts
// (server.crt/.key) and a client certificate (client.crt/.key) into --dir: what
// `tools/bench compare --tls` and the Python TLS tests run with. Not for production.
func tlsTestCerts(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkv_bench tls-testcerts", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "directory to write ca.crt, server.crt/.key, client.crt/.key into")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated IPs and names the server certificate is valid for")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(stderr, "dfkv_bench tls-testcerts: --dir is required")
		return exitSetup
	}
	err := func() error {
		ca, err := securetest.NewCA("dfkv test CA")
		if err != nil {
			return err
		}
		if _, err := ca.WriteCA(*dir, "ca"); err != nil {
			return err
		}
		srv, err := ca.Issue("dfkv-server", securetest.LeafOptions{Hosts: strings.Split(*hosts, ",")})
		if err != nil {
			return err
		}
		if _, _, err := srv.Write(*dir, "server"); err != nil {
			return err
		}
		cli, err := ca.Issue("dfkv-client", securetest.LeafOptions{Client: true})
		if err != nil {
			return err
		}
		_, _, err = cli.Write(*dir, "client")
		return err
	}()
	if err != nil {
		fmt.Fprintln(stderr, "dfkv_bench tls-testcerts:", err)
		return exitSetup
	}
	fmt.Fprintf(stdout, "wrote %s/{ca,server,client}.crt and server.key, client.key\n", *dir)
	return exitOK
}
