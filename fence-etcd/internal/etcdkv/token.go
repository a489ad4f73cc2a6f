package etcdkv

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/leasefence/leasefence/leasecore"
)

// tokenDigits is the width of an encoded token: enough for every uint64.
const tokenDigits = 20

// EncodeToken returns t as a 20-digit zero-padded decimal. etcd compares
// values as byte strings, so with a fixed width the byte order of two
// encoded tokens is their numeric order, and a transaction can compare a
// stored floor with a token: Compare(Value(floor), ">", EncodeToken(t)).
func EncodeToken(t leasecore.Token) string {
	// Without fmt: every fenced request encodes a token, and Sprintf's
	// reflection cost more than the rest of building the compare.
	b := [tokenDigits]byte{'0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0'}
	var digits [tokenDigits]byte
	d := strconv.AppendUint(digits[:0], uint64(t), 10)
	copy(b[tokenDigits-len(d):], d)
	return string(b[:])
}

// DecodeToken parses a value EncodeToken produced.
func DecodeToken(s string) (leasecore.Token, error) {
	if len(s) != tokenDigits {
		return 0, fmt.Errorf("token value %q is not %d decimal digits", s, tokenDigits)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("token value %q is not %d decimal digits", s, tokenDigits)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("token value %q: %w", s, err)
	}
	return leasecore.Token(n), nil
}

// EncodeFloorSpace returns the value of a floor's token-space key
// (Layout.FloorSpace): the token that raised the floor, encoded, a space,
// and the token's space. It is written in the transaction that raises the
// floor to t. The token binds the space to that floor: a floor raised later
// by a claim without a space, or by a version that does not write this key,
// leaves a value whose token is not the floor's, which DecodeFloorSpace's
// caller then ignores.
func EncodeFloorSpace(t leasecore.Token, space string) string {
	return EncodeToken(t) + " " + space
}

// DecodeFloorSpace parses a value EncodeFloorSpace produced.
func DecodeFloorSpace(s string) (leasecore.Token, string, error) {
	enc, space, ok := strings.Cut(s, " ")
	if !ok || space == "" {
		return 0, "", fmt.Errorf("token space value %q is not <token> <space>", s)
	}
	t, err := DecodeToken(enc)
	if err != nil {
		return 0, "", err
	}
	return t, space, nil
}
