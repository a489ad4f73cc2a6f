package etcdtemp

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// socketOwner returns the index in pids of the process that owns the other end of conn, an
// accepted loopback connection, or -1. It finds the other end's socket in /proc/net/tcp (local
// address = conn's remote address, remote address = conn's local address) and looks for its
// inode among each process's open files.
//
// The proxies need it for the peer requests that carry no X-Server-From header: etcd's lease
// renewals and TimeToLive requests a follower forwards to the leader, version checks, and the
// raft transport's probes, which share its connections. All members dial from 127.0.0.1
// whatever their own address (the kernel picks the source address of the loopback route), so
// the address does not tell.
func socketOwner(conn net.Conn, pids []int) int {
	peer, ok1 := conn.RemoteAddr().(*net.TCPAddr)
	self, ok2 := conn.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return -1
	}
	inode := tcpInode(peer, self)
	if inode == "" {
		return -1
	}
	want := "socket:[" + inode + "]"
	for i, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // exited, or not ours to read
		}
		for _, e := range entries {
			if link, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && link == want {
				return i
			}
		}
	}
	return -1
}

// tcpInode returns the inode of the IPv4 TCP socket whose local address is local and remote
// address remote, from /proc/net/tcp, or "" when there is none.
func tcpInode(local, remote *net.TCPAddr) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header line
	for sc.Scan() {
		// "  sl  local_address rem_address   st tx_queue:rx_queue tr:tm->when retrnsmt   uid  timeout inode"
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if sameAddr(fields[1], local) && sameAddr(fields[2], remote) {
			return fields[9]
		}
	}
	return ""
}

// sameAddr compares a /proc/net/tcp address, "0100007F:1F90" (the IPv4 address as the kernel's
// 32-bit word in host byte order, in hex, then the port in hex), with a.
func sameAddr(field string, a *net.TCPAddr) bool {
	ipHex, portHex, ok := strings.Cut(field, ":")
	if !ok || len(ipHex) != 8 {
		return false
	}
	word, err := hex.DecodeString(ipHex)
	if err != nil {
		return false
	}
	var ip [4]byte
	binary.NativeEndian.PutUint32(ip[:], binary.BigEndian.Uint32(word))
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return false
	}
	ip4 := a.IP.To4()
	return ip4 != nil && net.IP(ip[:]).Equal(ip4) && int(port) == a.Port
}
