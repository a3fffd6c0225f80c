//go:build !linux

package client

import "errors"

func getcpuNode() (int, error) { return -1, errors.New("getcpu: not on this platform") }
