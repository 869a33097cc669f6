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

// heldSocket is a second descriptor of a caller's socket (holdCallerConn),
// -1 based: the zero value holds nothing.
type heldSocket struct{ fd1 int }

func (h heldSocket) ok() bool { return h.fd1 > 0 }

// holdSocket duplicates c's descriptor (close-on-exec).
func holdSocket(c *net.TCPConn) heldSocket {
	rc, err := c.SyscallConn()
	if err != nil {
		return heldSocket{}
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
		return heldSocket{}
	}
	return heldSocket{fd + 1}
}

// unacked is SIOCOUTQ of the held socket: it still answers after
// net/http closed its own descriptor.
func (h heldSocket) unacked() (int64, bool) {
	if !h.ok() {
		return 0, false
	}
	n, err := unix.IoctlGetInt(h.fd1-1, unix.SIOCOUTQ)
	if err != nil {
		return 0, false
	}
	return int64(n), true
}

// release closes the second descriptor: the socket closes with the last.
func (h *heldSocket) release() {
	if h.ok() {
		unix.Close(h.fd1 - 1)
		h.fd1 = 0
	}
}
