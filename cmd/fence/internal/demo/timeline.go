package demo

import (
	"fmt"
	"io"
	"time"
)

// timeline prints a story as aligned lines: elapsed time, who, what.
type timeline struct {
	w     io.Writer
	color bool
	start time.Time
}

// ANSI styles, used only when color is on.
const (
	bold  = "\x1b[1m"
	dim   = "\x1b[2m"
	red   = "\x1b[31m"
	green = "\x1b[32m"
	cyan  = "\x1b[36m"
	reset = "\x1b[0m"
)

func (tl *timeline) paint(style, s string) string {
	if !tl.color || style == "" {
		return s
	}
	return style + s + reset
}

// title starts a story and its clock.
func (tl *timeline) title(n int, text, setup string) {
	fmt.Fprintf(tl.w, "\n%s\n%s\n", tl.paint(bold, fmt.Sprintf("Story %d: %s", n, text)), tl.paint(dim, "  "+setup))
	tl.start = time.Now()
}

// restart sets the story's clock to zero, after its set-up.
func (tl *timeline) restart() { tl.start = time.Now() }

// say prints one event.
func (tl *timeline) say(who, what string) { tl.line(who, what, "") }

// bad and good print an event that is the story's point.
func (tl *timeline) bad(who, what string)  { tl.line(who, "✗ "+what, red) }
func (tl *timeline) good(who, what string) { tl.line(who, "✓ "+what, green) }

func (tl *timeline) line(who, what, style string) {
	ms := time.Since(tl.start).Milliseconds()
	stamp := fmt.Sprintf("%+7dms", ms)
	fmt.Fprintf(tl.w, "  %s  %s  %s\n", tl.paint(dim, stamp), tl.paint(cyan, fmt.Sprintf("%-9s", who)), tl.paint(style, what))
}

// result closes a story with its outcome.
func (tl *timeline) result(ok bool, text string) {
	style, mark := red, "✗"
	if ok {
		style, mark = green, "✓"
	}
	fmt.Fprintf(tl.w, "  %s %s\n", tl.paint(style+bold, mark+" result:"), tl.paint(style, text))
}

// note prints plain text between the stories.
func (tl *timeline) note(text string) { fmt.Fprintln(tl.w, text) }
