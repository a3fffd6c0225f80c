package cabi

import (
	"os"
	"strings"
)

// LiveEnv, set by the library's cgo main, lists the DFKV_* variables of the process's C
// environment now ("NAME=value"). nil (tests, pure-Go builds): the Go environment is
// the truth.
var LiveEnv func() []string

// syncEnv makes the Go environment's DFKV_* variables what the C environment says at this
// Open: a Go c-shared library is handed only the environment its process started with, so
// without this a variable a host set afterwards (Python os.environ before opening a
// client, C setenv) would never reach the options below, and one it unset would linger.
func syncEnv() {
	if LiveEnv == nil {
		return
	}
	live := map[string]string{}
	for _, kv := range LiveEnv() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "DFKV_") {
			live[k] = v
		}
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := live[k]; strings.HasPrefix(k, "DFKV_") && !ok {
			os.Unsetenv(k)
		}
	}
	for k, v := range live {
		if cur, ok := os.LookupEnv(k); !ok || cur != v {
			os.Setenv(k, v)
		}
	}
}
