//go:build !linux

package railset

import "errors"

func getcpuNode() (int, error) { return -1, errors.New("getcpu: not on this platform") }
