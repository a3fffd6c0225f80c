// Command dfkvctl talks to dfkv nodes: put/get/exist/rm/stat on one node, and the cluster
// views ring/clients/stats/stat --all through the MDS.
//
// Exit status: 0 success or hit, 1 clean miss, 2 error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/cmd/internal/cli"
)

const (
	exitOK    = 0
	exitMiss  = 1
	exitError = 2
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: dfkvctl --node HOST:PORT [--ns NAMESPACE] [--tenant T] COMMAND
commands:
  put KEY FILE|-      store FILE (or stdin) under KEY
  get KEY [FILE|-]    write KEY's value to FILE (default stdout)
  exist KEY           print the stored length
  rm KEY              remove KEY
  stat                print the node's counters
cluster views (through the MDS: --mds HOST:PORT[,...] [--group G] [--json]):
  ring                members, address, weight, ring share, version and config
  clients             registered clients (cache consumers) of the group
  stats               ring totals (summed node counters) and the client count
  events              KV events of every node (--mds) or of --endpoint tcp://...: store/evict per node, gaps
  stat --all          every node's counters and the aggregate
security: --tls-ca FILE [--tls-cert FILE --tls-key FILE] (TLS 1.3, mTLS), --token T (tenant token)
exit status: 0 ok/hit, 1 miss, 2 error. Flags read DFKV_<FLAG> too (DFKV_NODE, DFKV_NS, DFKV_MDS, DFKV_TOKEN).
`)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkvctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	node := fs.String("node", "127.0.0.1:12000", "cache node address")
	ns := fs.String("ns", "", "key namespace")
	tenant := fs.String("tenant", "", "tenant (quota accounting)")
	timeout := fs.Duration("timeout", 10*time.Second, "per-request I/O timeout")
	var cf clusterFlags
	fs.StringVar(&cf.mds, "mds", "", "MDS replicas host:port[,...] (cluster views)")
	fs.StringVar(&cf.group, "group", "default", "MDS group (cluster views)")
	fs.BoolVar(&cf.json, "json", false, "JSON output (cluster views)")
	sec.define(fs)
	fs.Usage = func() { usage(stderr) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	if err := cli.ApplyEnv(fs); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	rest := fs.Args()
	if len(rest) == 0 {
		usage(stderr)
		return exitError
	}
	if rest[0] == "events" {
		cf.timeout = min(*timeout, 5*time.Second)
		return runEvents(rest[1:], cf, stdout, stderr)
	}
	if clusterCommand(rest[0], rest[1:]) {
		cf.timeout = min(*timeout, 5*time.Second)
		return runCluster(rest[0], rest[1:], cf, stdout, stderr)
	}
	if err := sec.load(); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	members, err := client.ParseMembers("node=" + *node)
	if err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	ms, _ := client.NewStatic(members)
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte(*ns), Tenant: []byte(*tenant),
		IOTimeout: *timeout, ConnectTimeout: *timeout, Cooldown: time.Millisecond, TLS: sec.cfg, Token: sec.token})
	if err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	defer c.Close()
	// ^C abandons the request in flight at once instead of waiting out the I/O timeout.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, argv := rest[0], rest[1:]
	need := func(lo, hi int) bool {
		if len(argv) < lo || len(argv) > hi {
			fmt.Fprintf(stderr, "dfkvctl: %s takes %d..%d arguments\n", cmd, lo, hi)
			return false
		}
		return true
	}
	switch cmd {
	case "put":
		if !need(2, 2) {
			return exitError
		}
		data, err := readInput(argv[1], stdin)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		return report(stderr, c.Put(ctx, []byte(argv[0]), data), func() { fmt.Fprintf(stdout, "stored %d bytes\n", len(data)) })
	case "get":
		if !need(1, 2) {
			return exitError
		}
		out := "-"
		if len(argv) == 2 {
			out = argv[1]
		}
		return get(ctx, c, []byte(argv[0]), out, stdout, stderr)
	case "exist":
		if !need(1, 1) {
			return exitError
		}
		n, err := c.Exist(ctx, []byte(argv[0]))
		return report(stderr, err, func() { fmt.Fprintln(stdout, n) })
	case "rm":
		if !need(1, 1) {
			return exitError
		}
		return report(stderr, c.Remove(ctx, []byte(argv[0])), func() { fmt.Fprintln(stdout, "removed") })
	case "stat":
		if !need(0, 0) {
			return exitError
		}
		st, err := c.NodeStats(ctx, *node)
		return report(stderr, err, func() {
			names := make([]string, 0, len(st))
			for k := range st {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				fmt.Fprintf(stdout, "%-24s %.0f\n", k, st[k])
			}
		})
	default:
		fmt.Fprintf(stderr, "dfkvctl: unknown command %q\n", cmd)
		usage(stderr)
		return exitError
	}
}

func readInput(name string, stdin io.Reader) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(name)
}

// get sizes the buffer with EXIST, then reads; a value that grew in between is re-read.
func get(ctx context.Context, c *client.Client, key []byte, out string, stdout, stderr io.Writer) int {
	for attempt := 0; attempt < 3; attempt++ {
		n, err := c.Exist(ctx, key)
		if err != nil {
			return report(stderr, err, nil)
		}
		buf := make([]byte, n)
		got, err := c.GetAuto(ctx, key, buf)
		if errors.Is(err, client.ErrBufferTooSmall) {
			continue
		}
		if err != nil {
			return report(stderr, err, nil)
		}
		if out == "-" {
			_, err = stdout.Write(buf[:got])
		} else {
			err = os.WriteFile(out, buf[:got], 0o644)
		}
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		return exitOK
	}
	fmt.Fprintln(stderr, "dfkvctl: value kept changing size")
	return exitError
}

func report(stderr io.Writer, err error, ok func()) int {
	switch {
	case err == nil:
		if ok != nil {
			ok()
		}
		return exitOK
	case errors.Is(err, client.ErrNotFound):
		fmt.Fprintln(stderr, "dfkvctl: not found")
		return exitMiss
	default:
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
}
