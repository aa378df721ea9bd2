package lab

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// checkLinearizable is P5: porcupine checks, per register, that the reads
// and writes the workers saw accepted are linearizable as a register, and
// that the tokens the acquisitions returned are linearizable as a source of
// strictly increasing numbers. It returns the worse of the two results:
// Ok, Illegal or Unknown (porcupine ran out of time), with which one failed.
func checkLinearizable(events []Event) string {
	register := porcupine.Model{
		Partition: byKey,
		Init:      func() any { return "" },
		Step: func(state, input, output any) (bool, any) {
			in := input.(regInput)
			if in.write {
				return true, in.value
			}
			return output.(string) == state.(string), state
		},
	}
	tokens := porcupine.Model{
		Partition: byKey,
		Init:      func() any { return int64(0) },
		Step: func(state, _, output any) (bool, any) {
			t := output.(int64)
			return t > state.(int64), t
		},
	}
	reg := porcupine.CheckOperationsTimeout(register, registerOps(events), 20*time.Second)
	tok := porcupine.CheckOperationsTimeout(tokens, tokenOps(events), 20*time.Second)
	switch {
	case reg == porcupine.Ok && tok == porcupine.Ok:
		return "Ok"
	case tok == porcupine.Illegal:
		return "Illegal (tokens)"
	case reg == porcupine.Illegal:
		return "Illegal (register)"
	default:
		return fmt.Sprintf("Unknown (register %s, tokens %s)", reg, tok)
	}
}

type regInput struct {
	key   string
	write bool
	value string
}

// opKey is what Partition needs of an operation.
func opKey(op porcupine.Operation) string {
	switch in := op.Input.(type) {
	case regInput:
		return in.key
	case string:
		return in
	}
	return ""
}

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

// registerOps pairs read and write invocations with their outcomes. Rejected
// operations had no effect and are left out; a write of unknown outcome may
// take effect at any time after its call; a read without an answer tells
// nothing.
func registerOps(events []Event) []porcupine.Operation {
	type pending struct {
		e    Event
		call int64
	}
	open := map[string]pending{}
	var ops []porcupine.Operation
	client := map[string]int{}
	for _, e := range events {
		if e.Kind != "read" && e.Kind != "write" {
			continue
		}
		if _, ok := client[e.Worker]; !ok {
			client[e.Worker] = len(client)
		}
		id := e.Op + "/" + e.Kind
		if e.Phase == "invoke" {
			open[id] = pending{e: e, call: e.Mono}
			continue
		}
		p, ok := open[id]
		if !ok {
			continue
		}
		delete(open, id)
		if e.Phase != "ok" {
			continue // rejected: no effect
		}
		in := regInput{key: e.Key, write: e.Kind == "write", value: strings.Join(p.e.Value, ",")}
		ops = append(ops, porcupine.Operation{ClientId: client[e.Worker], Input: in, Call: p.call,
			Output: strings.Join(e.Value, ","), Return: e.Mono})
	}
	for _, p := range open {
		if p.e.Kind == "write" {
			ops = append(ops, porcupine.Operation{ClientId: client[p.e.Worker], Call: p.call, Return: math.MaxInt64,
				Input: regInput{key: p.e.Key, write: true, value: strings.Join(p.e.Value, ",")}, Output: ""})
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
