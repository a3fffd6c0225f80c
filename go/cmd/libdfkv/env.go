package main

/*
#include <stdlib.h>
extern char **environ;
static char *dfkvc_env_at(int i) { return environ[i]; }
*/
import "C"

import (
	"strings"

	"github.com/dfkv/dfkv/go/internal/cabi"
)

func init() { cabi.LiveEnv = liveEnv }

// maxEnv bounds the walk over environ (a corrupt table must not run away).
const maxEnv = 1 << 20

// liveEnv lists the DFKV_* variables of the process's C environment as it is now. A Go
// c-shared library otherwise sees only the environment the process started with, so a
// host that sets DFKV_RDMA_* before opening a client (Python's os.environ, setenv in C)
// would be ignored.
func liveEnv() []string {
	var out []string
	for i := 0; i < maxEnv; i++ {
		p := C.dfkvc_env_at(C.int(i))
		if p == nil {
			break
		}
		if s := C.GoString(p); strings.HasPrefix(s, "DFKV_") {
			out = append(out, s)
		}
	}
	return out
}
