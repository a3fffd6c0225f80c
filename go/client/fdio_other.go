//go:build !linux

package client

import (
	"errors"
	"net"
	"time"
)

// fdConn exists on Linux only; elsewhere Options.BlockingIO keeps the netpoller path.
type fdConn struct{}

// blockingSupported: Options.BlockingIO has an effect.
const blockingSupported = false

var errNoBlockingIO = errors.New("blocking I/O is Linux-only")

func blockingConn(net.Conn) (*fdConn, error) { return nil, nil }

func (*fdConn) Read([]byte) (int, error)    { return 0, errNoBlockingIO }
func (*fdConn) Write([]byte) (int, error)   { return 0, errNoBlockingIO }
func (*fdConn) Close() error                { return nil }
func (*fdConn) interrupt()                  {}
func (*fdConn) SetDeadline(time.Time) error { return nil }
func (*fdConn) readv([][]byte) error        { return errNoBlockingIO }
func (*fdConn) writev([][]byte) error       { return errNoBlockingIO }
func (*fdConn) detach() int                 { return -1 }
