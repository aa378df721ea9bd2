// Package nilctxtest runs a call made with a nil context.Context for the
// tests of the rule that package nilctx words: it reports the call's error,
// or that the call panicked or hung, instead of letting a panic end the
// test binary or a hang run into its timeout.
package nilctxtest

import (
	"errors"
	"strings"
	"time"
)

// Call runs call and returns its error, or one that says it panicked (with
// the first line of the panic) or had not returned after 10 s.
func Call(call func() error) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				msg := "a panic"
				switch p := p.(type) {
				case error:
					msg = p.Error()
				case string:
					msg = p
				}
				done <- errors.New("panicked: " + strings.TrimSpace(strings.SplitN(msg, "\n", 2)[0]))
			}
		}()
		done <- call()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("has not returned after 10 s")
	}
}
