package pgtemp

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// ErrNoPatroni means the patroni program or the etcd program was not found. The wrapping error
// says what to install.
var ErrNoPatroni = errors.New("pgtemp: Patroni or etcd not found")

// PatroniMember is one member of a PatroniCluster: its name in Patroni and where its
// PostgreSQL listens.
type PatroniMember struct {
	Name string // "pg1", "pg2", "pg3"
	Host string // 127.0.0.1, 127.0.0.2, 127.0.0.3
	Port int
}

// DSN returns a postgres:// URL for database on m, as the superuser.
func (m PatroniMember) DSN(database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", superuser, net.JoinHostPort(m.Host, strconv.Itoa(m.Port)), database)
}

// String is "pg1 127.0.0.1:5432".
func (m PatroniMember) String() string {
	return m.Name + " " + net.JoinHostPort(m.Host, strconv.Itoa(m.Port))
}
