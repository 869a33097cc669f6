//go:build linux

package platformgw

import (
	"net"

	"golang.org/x/sys/unix"
)

// unackedBytes is what the kernel holds in c's send queue that the peer
// has not acknowledged: SIOCOUTQ, the bytes written but not yet sent plus
// those sent and not yet ACKed. It reads the connection's descriptor in
// place (RawConn.Control, no dup). It still answers after the peer reset
// the connection (the kernel keeps the sequence numbers), and false once
// the connection is closed.
func unackedBytes(c *net.TCPConn) (int64, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
		return 0, false
	}
	return int64(n), true
}
