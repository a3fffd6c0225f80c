// Command gen writes dfkv's Grafana dashboards (package opsdash) as JSON files.
//
//	go run ./go/internal/opsdash/gen -out docs/ops/grafana
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dfkv/dfkv/go/internal/opsdash"
)

func main() {
	out := flag.String("out", "docs/ops/grafana", "directory to write the dashboards to")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, d := range opsdash.All() {
		b, err := d.JSON()
		if err == nil {
			err = os.WriteFile(filepath.Join(*out, d.File), b, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("wrote", filepath.Join(*out, d.File))
	}
}
