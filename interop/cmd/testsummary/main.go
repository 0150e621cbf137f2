// Command testsummary reads `go test -json` (test2json) streams, one per target, and prints,
// per target, each failed and skipped test with its output and a count; then one last line
// "N passed, N failed" over all targets. It exits 1 if any test failed or a stream is missing.
//
//	testsummary kube-apiserver=kube.json svc-gateway=gateway.json
//
// Tests and subtests are counted alike; a package-level failure (a panic, a timeout, a build
// error) with no failed test in it counts as one failure.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type result struct {
	passed, failed, skipped int
	failures, skips         []string
}

func summarize(path string) (result, error) {
	var r result
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	output := map[string]*strings.Builder{}
	pkgFailed := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		key := e.Test
		if output[key] == nil {
			output[key] = &strings.Builder{}
		}
		switch e.Action {
		case "output":
			output[key].WriteString(e.Output)
		case "pass":
			if e.Test != "" {
				r.passed++
			}
		case "fail":
			if e.Test == "" {
				pkgFailed = true
			} else {
				r.failed++
				r.failures = append(r.failures, e.Test+"\n"+indent(output[key].String()))
			}
		case "skip":
			if e.Test != "" {
				r.skipped++
				r.skips = append(r.skips, e.Test+": "+lastLine(output[key].String()))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if pkgFailed && r.failed == 0 {
		r.failed++
		tail := output[""].String()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		r.failures = append(r.failures, "(package)\n"+indent(tail))
	}
	sort.Strings(r.skips)
	return r, nil
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "---") && !strings.HasPrefix(l, "===") {
			return l
		}
	}
	return ""
}

func main() {
	total := result{}
	bad := false
	for _, arg := range os.Args[1:] {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "usage: testsummary NAME=FILE...\n")
			os.Exit(2)
		}
		r, err := summarize(path)
		if err != nil {
			fmt.Printf("%s: no results: %v\n", name, err)
			total.failed++
			bad = true
			continue
		}
		for _, f := range r.failures {
			fmt.Printf("%s: FAIL %s\n", name, f)
		}
		for _, s := range r.skips {
			fmt.Printf("%s: SKIP %s\n", name, s)
		}
		fmt.Printf("%s: %d passed, %d failed, %d skipped\n", name, r.passed, r.failed, r.skipped)
		total.passed += r.passed
		total.failed += r.failed
	}
	fmt.Printf("%d passed, %d failed\n", total.passed, total.failed)
	if bad || total.failed > 0 {
		os.Exit(1)
	}
}
