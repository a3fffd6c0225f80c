package server

import "syscall"

// errTooManyFiles is the accept error that warrants a back-off rather than a stop.
var errTooManyFiles error = syscall.EMFILE
