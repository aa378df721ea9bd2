package lab

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// P5History is one history porcupine checked: a model, a register (or
// lock, for the tokens), how many operations it held and the result.
type P5History struct {
	Model  string `json:"model"` // register, rmw or tokens
	Key    string `json:"key"`
	Ops    int    `json:"ops"`
	Result string `json:"result"` // Ok, Illegal or Unknown
}

// The histories are recorded on the client side: each worker process
// stamps the invocation and the return of every read, write and
// acquisition with CLOCK_MONOTONIC (shared by all processes on the
// machine), around its real call to the database (or to the HTTP resource,
// or to Redis), and reports what the call returned. Three models:
//
//   - register: every read that returned a value and every write the
//     database acknowledged (or whose outcome is unknown), as reads and
//     blind writes of a register. It fails if the store serves a value that
//     was already overwritten when the read began (a stale replica, a cache,
//     a read outside the store's order). The lab's SQLite is linearizable,
//     so no run of the lab, control or protected, shows Illegal here: a
//     lost update is not a register violation (the late write is a legal
//     blind write); that is what the next model is for.
//   - rmw: each lease's read-modify-write, from the read's invocation to the
//     write's return, as one atomic update "if the value is what I read,
//     make it what I wrote". That is what the lock is for; it fails when
//     two holders both read the same value and both writes are accepted
//     (a lost update): controls of scenarios 1 and 3 show it.
//   - tokens: the tokens the acquisitions returned, as a source of
//     strictly increasing numbers.
const p5Timeout = 20 * time.Second

// checkLinearizable is P5: porcupine checks each history (one per register
// and model) and the verdict is the worst result, naming the model that
// failed: Ok, Illegal or Unknown (porcupine ran out of time). It returns
// the histories checked, with their sizes.
func checkLinearizable(events []Event) (string, []P5History) {
	register := porcupine.Model{
		Init: func() any { return "" },
		Step: func(state, input, output any) (bool, any) {
			in := input.(regInput)
			if in.write {
				return true, in.value
			}
			return output.(string) == state.(string), state
		},
	}
	rmw := porcupine.Model{
		Init: func() any { return "" },
		Step: func(state, input, _ any) (bool, any) {
			in := input.(rmwInput)
			switch {
			case state.(string) == in.from:
				return true, in.to
			case in.unknown:
				return true, state // it may not have taken effect
			}
			return false, state
		},
	}
	tokens := porcupine.Model{
		Init: func() any { return int64(0) },
		Step: func(state, _, output any) (bool, any) {
			t := output.(int64)
			return t > state.(int64), t
		},
	}
	var hs []P5History
	worst := map[string]porcupine.CheckResult{}
	check := func(name string, m porcupine.Model, ops []porcupine.Operation) {
		for _, part := range byKey(ops) {
			res := porcupine.CheckOperationsTimeout(m, part, p5Timeout)
			hs = append(hs, P5History{Model: name, Key: opKey(part[0]), Ops: len(part), Result: string(res)})
			if res != porcupine.Ok && worst[name] != porcupine.Illegal {
				worst[name] = res
			}
		}
	}
	check("tokens", tokens, tokenOps(events))
	check("register", register, registerOps(events))
	check("rmw", rmw, rmwOps(events))
	var illegal, unknown []string
	for _, name := range []string{"tokens", "register", "rmw"} {
		switch worst[name] {
		case porcupine.Illegal:
			illegal = append(illegal, name)
		case porcupine.Unknown:
			unknown = append(unknown, name)
		}
	}
	switch {
	case len(illegal) > 0:
		return fmt.Sprintf("Illegal (%s)", strings.Join(illegal, ", ")), hs
	case len(unknown) > 0:
		return fmt.Sprintf("Unknown (%s)", strings.Join(unknown, ", ")), hs
	}
	return "Ok", hs
}

// p5Sizes summarizes the histories checked: how many, and their sizes.
func p5Sizes(hs []P5History) string {
	if len(hs) == 0 {
		return "0"
	}
	lo, hi, total := math.MaxInt, 0, 0
	for _, h := range hs {
		lo, hi, total = min(lo, h.Ops), max(hi, h.Ops), total+h.Ops
	}
	return fmt.Sprintf("%d (%d ops, %d–%d each)", len(hs), total, lo, hi)
}

type regInput struct {
	key   string
	write bool
	value string
}

// rmwInput is a lease's read-modify-write: from what it read to what it
// wrote.
type rmwInput struct {
	key      string
	from, to string
	unknown  bool // the write's outcome is unknown
}

// opKey is what byKey needs of an operation.
func opKey(op porcupine.Operation) string {
	switch in := op.Input.(type) {
	case regInput:
		return in.key
	case rmwInput:
		return in.key
	case string:
		return in
	}
	return ""
}

// byKey partitions ops by register, in order of first appearance.
func byKey(ops []porcupine.Operation) [][]porcupine.Operation {
	parts := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range ops {
		k := opKey(op)
		if _, ok := parts[k]; !ok {
			order = append(order, k)
		}
		parts[k] = append(parts[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, k := range order {
		out = append(out, parts[k])
	}
	return out
}

// clients numbers the workers for porcupine.
type clients map[string]int

func (c clients) id(worker string) int {
	if _, ok := c[worker]; !ok {
		c[worker] = len(c)
	}
	return c[worker]
}

// registerOps pairs read and write invocations with their outcomes. Rejected
// operations had no effect and are left out; a write of unknown outcome may
// take effect at any time after its call; a read without an answer tells
// nothing.
func registerOps(events []Event) []porcupine.Operation {
	open := map[string]Event{}
	var ops []porcupine.Operation
	client := clients{}
	for _, e := range events {
		if e.Kind != "read" && e.Kind != "write" {
			continue
		}
		id := e.Op + "/" + e.Kind
		if e.Phase == "invoke" {
			open[id] = e
			continue
		}
		call, ok := open[id]
		if !ok {
			continue
		}
		delete(open, id)
		if e.Phase != "ok" {
			continue // rejected: no effect
		}
		in := regInput{key: e.Key, write: e.Kind == "write", value: strings.Join(call.Value, ",")}
		ops = append(ops, porcupine.Operation{ClientId: client.id(e.Worker), Input: in, Call: call.Mono,
			Output: strings.Join(e.Value, ","), Return: e.Mono})
	}
	for _, id := range slices.Sorted(maps.Keys(open)) {
		if p := open[id]; p.Kind == "write" {
			ops = append(ops, porcupine.Operation{ClientId: client.id(p.Worker), Call: p.Mono, Return: math.MaxInt64,
				Input: regInput{key: p.Key, write: true, value: strings.Join(p.Value, ",")}, Output: ""})
		}
	}
	return ops
}

// rmwOps are the leases' read-modify-writes whose read returned and whose
// write was acknowledged or of unknown outcome: from the read's invocation
// to the write's return (never, if unknown). Rejected writes had no effect.
func rmwOps(events []Event) []porcupine.Operation {
	type pending struct {
		call     int64
		from, to string
		read     bool
		wrote    bool
	}
	open := map[string]*pending{}
	var ops []porcupine.Operation
	client := clients{}
	for _, e := range events {
		switch {
		case e.Kind == "read" && e.Phase == "invoke":
			open[e.Op] = &pending{call: e.Mono}
		case e.Kind == "read" && e.Phase == "ok":
			if p := open[e.Op]; p != nil {
				p.from, p.read = strings.Join(e.Value, ","), true
			}
		case e.Kind == "write" && e.Phase == "invoke":
			if p := open[e.Op]; p != nil {
				p.to, p.wrote = strings.Join(e.Value, ","), true
			}
		case e.Kind == "write":
			p := open[e.Op]
			delete(open, e.Op)
			if p == nil || !p.read || !p.wrote || e.Phase == "fail" {
				continue
			}
			ret := e.Mono
			if e.Phase != "ok" {
				ret = math.MaxInt64
			}
			ops = append(ops, porcupine.Operation{ClientId: client.id(e.Worker), Call: p.call, Return: ret,
				Input: rmwInput{key: e.Key, from: p.from, to: p.to, unknown: e.Phase != "ok"}})
		}
	}
	return ops
}

// tokenOps are the acquisitions that returned a token.
func tokenOps(events []Event) []porcupine.Operation {
	calls := map[string]int64{}
	var ops []porcupine.Operation
	for _, e := range events {
		if e.Kind != "acquire" {
			continue
		}
		switch e.Phase {
		case "invoke":
			calls[e.Op] = e.Mono
		case "ok":
			ops = append(ops, porcupine.Operation{Input: e.Key, Call: calls[e.Op], Output: e.Token, Return: e.Mono})
		}
	}
	return ops
}
