package main

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// countingProxy forwards TCP to a Redis server and counts the commands
// clients send (top-level RESP arrays, or inline lines): the round trips a
// library costs, which INFO commandstats cannot tell apart from the
// commands that scripts run inside the server.
type countingProxy struct {
	ln       net.Listener
	upstream string
	commands atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex
	names map[string]int64 // commands by name, when not nil (tally)
}

// tally starts counting commands by name as well (for BenchmarkContended).
func (p *countingProxy) tally() {
	p.mu.Lock()
	p.names = map[string]int64{}
	p.mu.Unlock()
}

// byName returns the commands counted by name since tally, and restarts.
func (p *countingProxy) byName() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.names
	p.names = map[string]int64{}
	return out
}

func newCountingProxy(upstream string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

func (p *countingProxy) close() {
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *countingProxy) serve() {
	defer p.wg.Done()
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		conns.Wait()
	}()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		mu.Lock()
		open = append(open, client, server)
		mu.Unlock()
		conns.Add(2)
		go func() { defer conns.Done(); _, _ = io.Copy(client, server); _ = client.Close() }()
		go func() { defer conns.Done(); p.count(io.TeeReader(client, server)); _ = server.Close() }()
	}
}

// count parses the client's stream as it passes and counts commands.
func (p *countingProxy) count(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		p.commands.Add(1)
		if len(line) < 3 || line[0] != '*' {
			continue // an inline command
		}
		n, _ := strconv.Atoi(string(line[1 : len(line)-2]))
		for j := range n {
			hdr, err := br.ReadSlice('\n')
			if err != nil || len(hdr) < 3 || hdr[0] != '$' {
				return
			}
			size, _ := strconv.Atoi(string(hdr[1 : len(hdr)-2]))
			if j == 0 {
				p.mu.Lock()
				if p.names != nil {
					if b, err := br.Peek(size); err == nil {
						p.names[strings.ToUpper(string(b))]++
					}
				}
				p.mu.Unlock()
			}
			if _, err := br.Discard(size + 2); err != nil {
				return
			}
		}
	}
}
