// Package iovec builds and advances the iovec arrays of gathered socket calls (sendmsg,
// recvmsg): the client's blocking I/O for C callers and the server's raw socket calls
// share them, including the bookkeeping of a short transfer.
package iovec
