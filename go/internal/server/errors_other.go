//go:build !linux

package server

import "syscall"

var errTooManyFiles error = syscall.EMFILE
