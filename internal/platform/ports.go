package platform

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Caddy listens with SO_REUSEPORT (listen_unix.go), so on Linux a second
// gateway started with the same admin address or site addresses does not
// fail to bind: both listen, the kernel splits new connections between
// them, and each meters its share into its own store. checkSharedPorts
// refuses that at Start: every TCP port this process listens on (the admin
// endpoint is up before any app starts; the sites once the http app has
// started) and every TCP address the http app is configured for (the http
// app may start after this one) must have no listening socket of another
// process on it. It reads /proc, so it checks on Linux only; elsewhere it
// passes.

// listenSocket is one listening TCP socket of /proc/net/tcp{,6}.
type listenSocket struct {
	ip    net.IP
	port  int
	inode string
}

// siteAddrs are the TCP listen addresses of the http app's servers,
// placeholders resolved as the http app resolves them, and by port the
// words that name them in an error.
func siteAddrs(ctx caddy.Context) (map[int]string, []listenSocket) {
	sites := map[int]string{}
	var want []listenSocket
	app, err := ctx.AppIfConfigured("http")
	if err != nil {
		return sites, nil
	}
	httpApp, ok := app.(*caddyhttp.App)
	if !ok {
		return sites, nil
	}
	repl := caddy.NewReplacer()
	names := make([]string, 0, len(httpApp.Servers))
	for name := range httpApp.Servers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, l := range httpApp.Servers[name].Listen {
			addr, err := caddy.ParseNetworkAddress(repl.ReplaceAll(l, ""))
			if err != nil || addr.IsUnixNetwork() || addr.IsFdNetwork() || !strings.HasPrefix(addr.Network, "tcp") {
				continue
			}
			ip := net.ParseIP(addr.Host)
			if ip == nil {
				ip = net.IPv6unspecified // a host name, or none: any address
				if addr.Host == "localhost" {
					ip = net.IPv4(127, 0, 0, 1)
				}
			}
			for p := addr.StartPort; p <= addr.EndPort; p++ {
				if _, ok := sites[int(p)]; !ok {
					sites[int(p)] = fmt.Sprintf("the site address %s (server %s)", l, name)
				}
				want = append(want, listenSocket{ip: ip, port: int(p)})
			}
		}
	}
	return sites, want
}

// checkSharedPorts returns an error naming each address of this gateway
// on which another process listens too, with that process.
func checkSharedPorts(ctx caddy.Context) error {
	// This process's sockets are read before and after the table: one it
	// closes meanwhile (a reload replaces the admin server and closes
	// the old one in the background) is in the first read, one it opens
	// in the second, so neither is taken for another process's.
	mine, err := ownSocketInodes()
	if err != nil {
		return nil // no /proc (not Linux): nothing to check with
	}
	all, err := procListeners()
	if err != nil {
		return nil
	}
	after, err := ownSocketInodes()
	if err != nil {
		return nil
	}
	for inode := range after {
		mine[inode] = true
	}
	sites, want := siteAddrs(ctx)
	for _, s := range all {
		if mine[s.inode] {
			want = append(want, s)
		}
	}
	shared := map[int]string{}
	for _, w := range want {
		for _, s := range all {
			if _, done := shared[w.port]; done || mine[s.inode] || s.port != w.port || !overlap(w.ip, s.ip) {
				continue
			}
			what, ok := sites[w.port]
			if !ok {
				what = "the admin endpoint (a listener of this process that is not a site)"
			}
			shared[w.port] = fmt.Sprintf("port %d, %s, by %s", w.port, what, socketOwner(s.inode))
		}
	}
	if len(shared) == 0 {
		return nil
	}
	ports := make([]int, 0, len(shared))
	for p := range shared {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	var list []string
	for _, p := range ports {
		list = append(list, shared[p])
	}
	return fmt.Errorf("another process already listens where this gateway would: %s. Caddy listens with SO_REUSEPORT, "+
		"so both would accept connections there and the kernel would split them between the two, each gateway metering "+
		"its share into its own store. Stop the other process, give this gateway other ports (the admin option and the "+
		"site addresses), or set allow_shared_ports in the platform block if the sharing is deliberate (docs/operations.md)",
		strings.Join(list, "; "))
}

// overlap says whether sockets bound to a and b accept the same
// connections on a port: the same address, or an unspecified one (an
// IPv6 wildcard takes IPv4 connections too, dual-stack).
func overlap(a, b net.IP) bool {
	if a.Equal(b) {
		return true
	}
	for _, pair := range [][2]net.IP{{a, b}, {b, a}} {
		x, y := pair[0], pair[1]
		if x.Equal(net.IPv6unspecified) {
			return true
		}
		if x.Equal(net.IPv4zero) && y.To4() != nil {
			return true
		}
	}
	return false
}

// procListeners reads the listening TCP sockets of this network namespace.
func procListeners() ([]listenSocket, error) {
	var out []listenSocket
	read := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		socks, err := parseProcNet(f)
		if err != nil {
			continue // tcp6 is missing without IPv6
		}
		read++
		out = append(out, socks...)
	}
	if read == 0 {
		return nil, fmt.Errorf("no /proc/net/tcp")
	}
	return out, nil
}

// parseProcNet reads one /proc/net/tcp{,6} table: "sl local_address
// rem_address st … uid timeout inode", addresses as hex words in host
// byte order, state 0A for LISTEN.
func parseProcNet(path string) ([]listenSocket, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []listenSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		host, port, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		raw, err := hex.DecodeString(host)
		if err != nil || len(raw)%4 != 0 {
			continue
		}
		ip := make(net.IP, len(raw))
		for i := 0; i < len(raw); i += 4 {
			binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			continue
		}
		out = append(out, listenSocket{ip: ip, port: int(p), inode: fields[9]})
	}
	return out, sc.Err()
}

// ownSocketInodes are the inodes of this process's sockets.
func ownSocketInodes() (map[string]bool, error) {
	return socketInodes("/proc/self/fd")
}

func socketInodes(fdDir string) (map[string]bool, error) {
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			out[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return out, nil
}

// socketOwner names the process holding the socket: "pid N: command
// line", or what can be said without permission to see it.
func socketOwner(inode string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	self := strconv.Itoa(os.Getpid())
	for _, dir := range procs {
		pid := filepath.Base(dir)
		if pid == self {
			continue
		}
		socks, err := socketInodes(filepath.Join(dir, "fd"))
		if err != nil || !socks[inode] {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		if len(line) > 200 {
			line = line[:200] + "…"
		}
		return "pid " + pid + ": " + line
	}
	return "socket inode " + inode + ", of a process not visible from here (another user's, or in another container); see ss -ltnp"
}
