// Command gofmt formats Go files in place with go/format, like `gofmt -w`. The Bazel
// FlatBuffers codegen (//schema:fb_gen) runs it on flatc's output, exactly as tools/gen.sh
// runs gofmt, so both routes produce the same bytes.
package main

import (
	"fmt"
	"go/format"
	"os"
)

func main() {
	for _, path := range os.Args[1:] {
		src, err := os.ReadFile(path)
		if err == nil {
			var out []byte
			if out, err = format.Source(src); err == nil {
				err = os.WriteFile(path, out, 0o644)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "gofmt: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}
