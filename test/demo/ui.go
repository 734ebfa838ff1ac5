package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// ANSI styles; used only when the output is a terminal.
const (
	styleBold   = "\x1b[1m"
	styleDim    = "\x1b[2m"
	styleRed    = "\x1b[31m"
	styleGreen  = "\x1b[32m"
	styleYellow = "\x1b[33m"
	styleCyan   = "\x1b[36m"
	styleReset  = "\x1b[0m"
)

// ui prints the tour and keeps the score.
type ui struct {
	w        io.Writer
	color    bool
	total    int // steps
	passed   int
	failed   []string
	warnings []string
	start    time.Time
}

func newUI(w io.Writer, color bool, steps int) *ui {
	return &ui{w: w, color: color, total: steps, start: time.Now()}
}

func (u *ui) style(s, text string) string {
	if !u.color {
		return text
	}
	return s + text + styleReset
}

func (u *ui) printf(format string, args ...any) { fmt.Fprintf(u.w, format, args...) }

// step announces a step with its one-line reason.
func (u *ui) step(n int, title, why string) {
	head := fmt.Sprintf("── %d/%d  %s ", n, u.total, title)
	if pad := 72 - utf8.RuneCountInString(head); pad > 0 {
		head += strings.Repeat("─", pad)
	}
	u.printf("\n%s\n", u.style(styleBold+styleCyan, head))
	u.printf("   %s\n\n", u.style(styleDim, "why: "+why))
}

// info prints an indented line of narration.
func (u *ui) info(format string, args ...any) {
	u.printf("   %s\n", fmt.Sprintf(format, args...))
}

// detail prints an indented, de-emphasised line (command lines, errors shown on purpose).
func (u *ui) detail(format string, args ...any) {
	u.printf("     %s\n", u.style(styleDim, fmt.Sprintf(format, args...)))
}

// check records and prints one verdict; err explains a failure.
func (u *ui) check(err error, format string, args ...any) bool {
	label := fmt.Sprintf(format, args...)
	if err == nil {
		u.passed++
		u.printf("   %s %s\n", u.style(styleGreen, "✓"), label)
		return true
	}
	u.failed = append(u.failed, label)
	u.printf("   %s %s\n", u.style(styleRed, "✗"), label)
	u.printf("     %s\n", u.style(styleRed, err.Error()))
	return false
}

// warn reports a known gap that does not fail the run.
func (u *ui) warn(label string, err error) {
	u.warnings = append(u.warnings, label)
	u.printf("   %s %s\n", u.style(styleYellow, "⚠"), label)
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			u.printf("     %s\n", u.style(styleYellow, line))
		}
	}
}

// mark renders a compact ✓/✗ for table cells.
func (u *ui) mark(ok bool) string {
	if ok {
		return u.style(styleGreen, "✓")
	}
	return u.style(styleRed, "✗")
}

var ansiRE = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// visibleWidth ignores colour codes, so coloured cells still line up.
func visibleWidth(s string) int { return utf8.RuneCountInString(ansiRE.ReplaceAllString(s, "")) }

// table prints rows under a bold header, columns padded to their widest cell.
func (u *ui) table(header []string, rows [][]string) {
	widths := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], visibleWidth(c))
		}
	}
	line := func(cells []string, style string) {
		var b strings.Builder
		for i, c := range cells {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := ""
			if i < len(cells)-1 {
				pad = strings.Repeat(" ", widths[i]-visibleWidth(c))
			}
			if style != "" {
				c = u.style(style, c)
			}
			b.WriteString(c + pad)
		}
		u.printf("   %s\n", b.String())
	}
	line(header, styleBold)
	for _, r := range rows {
		line(r, "")
	}
}

// summary prints the score and returns an error when any check failed.
func (u *ui) summary() error {
	took := time.Since(u.start).Round(100 * time.Millisecond)
	u.printf("\n")
	if len(u.failed) == 0 {
		u.printf("%s\n", u.style(styleBold+styleGreen, fmt.Sprintf("All %d checks passed in %v.", u.passed, took)))
	} else {
		u.printf("%s\n", u.style(styleBold+styleRed, fmt.Sprintf("%d of %d checks FAILED in %v:", len(u.failed), u.passed+len(u.failed), took)))
		for _, f := range u.failed {
			u.printf("   %s %s\n", u.style(styleRed, "✗"), f)
		}
	}
	for _, w := range u.warnings {
		u.printf("   %s %s\n", u.style(styleYellow, "⚠ known gap:"), w)
	}
	if len(u.failed) > 0 {
		return fmt.Errorf("%d checks failed", len(u.failed))
	}
	return nil
}
