package backendkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Bad input is rejected before anything is sent, with an error that names
// the field and wraps ErrInvalidArgument.
func ExampleCheckWrite() {
	err := backendkit.CheckWrite(context.Background(), leasecore.Write{
		Scope: "daily-report", Part: "summary", Content: "x", Writer: "holder-a", Token: 0,
	})
	var ae *leasecore.ArgError
	if errors.As(err, &ae) {
		fmt.Println("field:", ae.Field)
	}
	fmt.Println(errors.Is(err, leasecore.ErrInvalidArgument))
	fmt.Println(err)

	err = backendkit.CheckName("acquire", "holder", " holder-a"+strings.Repeat("x", 50))
	fmt.Println(err)

	// Output:
	// field: token
	// true
	// leasecore: write: invalid token 0: must be positive (0 is never issued)
	// leasecore: acquire: invalid holder " holder-axxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...: must not begin or end with whitespace
}
