//go:build !linux

package platformgw

import "net"

// unackedBytes cannot be measured here (SIOCOUTQ is Linux's): a caller
// that hangs up is charged the bytes written to its connection.
func unackedBytes(*net.TCPConn) (int64, bool) { return 0, false }

// heldSocket holds nothing here: a caller that hangs up is charged the
// bytes written.
type heldSocket struct{}

func (heldSocket) ok() bool               { return false }
func holdSocket(*net.TCPConn) heldSocket  { return heldSocket{} }
func (heldSocket) unacked() (int64, bool) { return 0, false }
func (*heldSocket) release()              {}
