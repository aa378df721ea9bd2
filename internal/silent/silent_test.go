package silent_test

import (
	"net"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/silent"
)

// TestAcceptsAndNeverAnswers: a dial succeeds; a read gets nothing before
// its deadline.
func TestAcceptsAndNeverAnswers(t *testing.T) {
	c, err := net.DialTimeout("tcp", silent.Addr(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Fatalf("read %d bytes, %v: want a timeout", n, err)
	}
}
