package etcdkv

import (
	"fmt"
	"net/url"
	"strings"
)

// LeasePrefix is the prefix of every lease key, "/" included: the range
// an operator's list of leases reads.
func (l Layout) LeasePrefix() string { return l.key("lease") + "/" }

// FloorPrefix is the prefix of every floor key, "/" included.
func (l Layout) FloorPrefix() string { return l.key("floor") + "/" }

// NameOf returns the name a key under prefix (LeasePrefix, FloorPrefix)
// stands for: the rest of the key, unescaped (see Layout).
func NameOf(prefix, key string) (string, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", fmt.Errorf("key %q is not a name under %q", key, prefix)
	}
	name, err := url.PathUnescape(rest)
	if err != nil {
		return "", fmt.Errorf("key %q: %w", key, err)
	}
	return name, nil
}
