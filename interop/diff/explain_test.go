package diff

import (
	"bufio"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// An explanation says that, in the cases matching `cases`, a difference at a field path
// matching `path` is the entry `id` of DIFFERENCES.md. Both are space-separated lists of
// globs: `*` matches any run of characters (dots and slashes included). Cases are "scenario/step"; paths are those of
// normalise (code, header.warning[0], body.message, events[2].object.metadata.name, ...).
type explanation struct {
	id    string
	cases string
	path  string
}

// entryRe matches an entry's heading in DIFFERENCES.md: "## D12. Title".
var (
	entryRe    = regexp.MustCompile(`^## (D\d+)\. `)
	categoryRe = regexp.MustCompile(`^Category: ([a-z-]+)`)
)

// categories of DIFFERENCES.md entries. "naming" entries are applied by normalisation (the
// svc.io group names) and need no row in the table; every other entry must have one.
var categories = map[string]bool{
	"naming":      true, // svc.io where Kubernetes has k8s.io: by design
	"spec":        true, // the spec says otherwise than Kubernetes; the spec wins
	"environment": true, // how the two servers are run (controllers, flags), not the code
	"being-fixed": true, // listed in FINDINGS.md and being fixed elsewhere
	"design":      true, // a decision of DESIGN.md or of the gateway, kept on purpose
	"kubernetes":  true, // a Kubernetes quirk or bug that the gateway does not copy
	"open":        true, // a gateway difference not fixed yet, with what it would take
}

type compiledExplanation struct {
	explanation
	cases, path *regexp.Regexp
	// timing: from timingDependent, need not occur in every run.
	timing bool
}

type explanations struct {
	list       []compiledExplanation
	category   map[string]string // id -> category
	mu         sync.Mutex
	seen       map[int]int // index in list -> times used
	ranCases   []string
	ranPerRule map[int]bool // a case matching the rule's cases ran
}

// glob compiles space-separated globs into one pattern that matches any of them.
func glob(g string) *regexp.Regexp {
	var alts []string
	for _, one := range strings.Fields(g) {
		parts := strings.Split(one, "*")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		alts = append(alts, strings.Join(parts, ".*"))
	}
	return regexp.MustCompile("^(" + strings.Join(alts, "|") + ")$")
}

// loadExplanations reads DIFFERENCES.md and checks it against the table: every id in the
// table is an entry, every entry (other than naming) has a row, every entry has a category.
func loadExplanations(t *testing.T, path string) *explanations {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read the explained differences: %v", err)
	}
	defer f.Close()
	e := &explanations{category: map[string]string{}, seen: map[int]int{}, ranPerRule: map[int]bool{}}
	sc := bufio.NewScanner(f)
	current := ""
	for sc.Scan() {
		line := sc.Text()
		if m := entryRe.FindStringSubmatch(line); m != nil {
			current = m[1]
			if _, dup := e.category[current]; dup {
				t.Fatalf("%s: entry %s twice", path, current)
			}
			e.category[current] = ""
			continue
		}
		if m := categoryRe.FindStringSubmatch(line); m != nil && current != "" && e.category[current] == "" {
			if !categories[m[1]] {
				t.Fatalf("%s: entry %s: unknown category %q", path, current, m[1])
			}
			e.category[current] = m[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for i, x := range append(append([]explanation{}, explained...), timingDependent...) {
		cat, ok := e.category[x.id]
		if !ok {
			t.Fatalf("explained_test.go names %s, which %s does not have", x.id, path)
		}
		if cat == "naming" {
			t.Fatalf("%s is a naming entry (applied by normalisation); it has no rows", x.id)
		}
		used[x.id] = true
		e.list = append(e.list, compiledExplanation{explanation: x, cases: glob(x.cases), path: glob(x.path),
			timing: i >= len(explained)})
	}
	var missing []string
	for id, cat := range e.category {
		if cat == "" {
			t.Fatalf("%s: entry %s has no Category: line", path, id)
		}
		if cat != "naming" && !used[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Fatalf("%s: entries with no row in explained_test.go (the runner cannot see them): %v", path, missing)
	}
	return e
}

// explain returns the id that explains a difference at path in caseName, or "".
func (e *explanations) explain(caseName, path string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range e.list {
		if x.cases.MatchString(caseName) && x.path.MatchString(path) {
			e.seen[i]++
			return x.id
		}
	}
	return ""
}

func (e *explanations) markRan(caseName string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range e.list {
		if x.cases.MatchString(caseName) {
			e.ranPerRule[i] = true
		}
	}
}

// checkAllSeen fails for every row whose cases ran without the difference it explains.
func (e *explanations) checkAllSeen(t *testing.T) {
	e.mu.Lock()
	defer e.mu.Unlock()
	counts := map[string]int{}
	for i, x := range e.list {
		counts[e.category[x.id]]++
		if e.ranPerRule[i] && e.seen[i] == 0 && !x.timing {
			t.Errorf("%s (cases %q, path %q) no longer occurs: fix DIFFERENCES.md and explained_test.go", x.id, x.cases, x.path)
		}
	}
	ids := map[string]int{}
	for id, cat := range e.category {
		_ = id
		ids[cat]++
	}
	t.Logf("explained differences by category (entries): %v; table rows by category: %v", ids, counts)
}
