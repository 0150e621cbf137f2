package diff

import (
	"fmt"
	"mime"
	"regexp"
	"sort"
	"strings"
	"time"
)

// normalise turns one answer into the tree that is compared:
//
//	code          the status code
//	header.*      the Warning headers (in order), the Content-Type, whether Retry-After is set
//	body          the decoded body, normalised (see value)
//	events[i]     watch events, normalised
//
// What is normalised away, on both servers alike:
//   - the gateway's group names: events.svc.io -> events.k8s.io, likewise certificates,
//     authentication, admissionregistration and meta (by design; DIFFERENCES.md, naming);
//   - uids (any UUID in any string) -> <uid>;
//   - server-set timestamps (any RFC 3339 time within an hour of now: creationTimestamp,
//     deletionTimestamp, managedFields[].time, Table date cells, condition times; the
//     scenarios' own times are in 2024) -> <time>;
//   - an object's metadata.resourceVersion -> <rvN>, N counting distinct values in order of
//     first sight within the scenario, so "changed or not" stays compared; a list's or a
//     bookmark's resourceVersion (a global revision: other writers move it) -> <rv>, or
//     <requested rv> when it is the resourceVersion the request named;
//   - a non-empty metadata.continue -> <continue> (remainingItemCount is kept);
//   - a name made from generateName -> the prefix followed by <gen>;
//   - a service-account token (a JWT) -> <jwt>;
//   - managedFields entries are sorted by operation and manager (their order depends on
//     time in whole seconds);
//   - global revisions quoted in messages ("current: 1234") -> <rv>.
func (st *state) normalise(a *answer, codeOnly bool, requestedRV string) map[string]any {
	st.reqRV = requestedRV
	out := map[string]any{"code": a.code}
	if codeOnly {
		return out
	}
	h := map[string]any{}
	if ws := a.header.Values("Warning"); len(ws) > 0 {
		var list []any
		for _, w := range ws {
			list = append(list, st.str(w))
		}
		h["warning"] = list
	}
	if ct := a.header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err == nil {
			// charset=utf-8 is JSON's only encoding anyway; compare the type and other parameters.
			delete(params, "charset")
			ct = mime.FormatMediaType(mt, params)
		}
		h["content-type"] = st.str(ct)
	}
	if a.header.Get("Retry-After") != "" {
		h["retry-after"] = "<set>"
	}
	out["header"] = h
	if a.events != nil {
		var evs []any
		for _, ev := range a.events {
			evs = append(evs, st.event(ev))
		}
		out["events"] = evs
	} else if len(a.raw) > 0 {
		body := st.value(a.body, "")
		sortConflictCauses(body)
		out["body"] = body
	}
	return out
}

// sortConflictCauses sorts an apply conflict's causes: Kubernetes lists them in map order,
// which changes from one request to the next.
func sortConflictCauses(body any) {
	causes, _ := lookup(body, "details.causes").([]any)
	for _, c := range causes {
		if m, _ := c.(map[string]any); m == nil || m["reason"] != "FieldManagerConflict" {
			return
		}
	}
	sort.Slice(causes, func(i, j int) bool {
		return fmt.Sprint(causes[i]) < fmt.Sprint(causes[j])
	})
}

func (st *state) event(ev any) any {
	m, ok := ev.(map[string]any)
	if !ok {
		return st.value(ev, "")
	}
	if m["type"] == "BOOKMARK" {
		if rv := lookup(m, "object.metadata.resourceVersion"); rv != nil && rv != "" {
			md := lookup(m, "object.metadata").(map[string]any)
			md["resourceVersion"] = "<rv>"
		}
	}
	return st.value(m, "")
}

var (
	uuidRe    = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	jwtRe     = regexp.MustCompile(`^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$`)
	currentRe = regexp.MustCompile(`current: \d+`)
	// a resourceVersion inside a message: an object printed as JSON, a precondition's record.
	embeddedRVRe   = regexp.MustCompile(`(resourceVersion\\*"\s*:\s*\\*")\d+|(in record )\(\d+\)`)
	embeddedTimeRe = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	// a client certificate's fingerprint (each server has its own PKI).
	fingerprintRe = regexp.MustCompile(`X509SHA256=[0-9a-f]{64}`)
	rfc3339Re     = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$`)
	tooOldRe      = regexp.MustCompile(`too old resource version: (\d+) \((\d+)\)`)
	listRVKind    = regexp.MustCompile(`List$`)
)

// str normalises one string: group names, UUIDs, recent times, tokens.
func (st *state) str(s string) string {
	if st.srv.suffix != "k8s.io" {
		s = gatewayGroup.ReplaceAllString(s, "$1.k8s.io")
	}
	s = uuidRe.ReplaceAllString(s, "<uid>")
	if rfc3339Re.MatchString(s) {
		if tm, err := time.Parse(time.RFC3339Nano, s); err == nil && time.Since(tm).Abs() < time.Hour {
			return "<time>"
		}
	}
	if jwtRe.MatchString(s) {
		return "<jwt>"
	}
	s = currentRe.ReplaceAllString(s, "current: <rv>")
	s = embeddedRVRe.ReplaceAllString(s, "$1$2<rv>")
	s = fingerprintRe.ReplaceAllString(s, "X509SHA256=<fingerprint>")
	s = embeddedTimeRe.ReplaceAllStringFunc(s, func(m string) string {
		if tm, err := time.Parse(time.RFC3339Nano, m); err == nil && time.Since(tm).Abs() < time.Hour {
			return "<time>"
		}
		return m
	})
	s = tooOldRe.ReplaceAllString(s, "too old resource version: $1 (<rv>)")
	return s
}

func (st *state) rvToken(v string) string {
	if v == "" {
		return ""
	}
	if tok, ok := st.rvs[v]; ok {
		return tok
	}
	tok := fmt.Sprintf("<rv%d>", len(st.rvs)+1)
	st.rvs[v] = tok
	return tok
}

// value normalises decoded JSON; key is the map key v was found under.
func (st *state) value(v any, key string) any {
	switch v := v.(type) {
	case string:
		return st.str(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = st.value(x, key)
		}
		return out
	case map[string]any:
		return st.object(v)
	default:
		return v
	}
}

func (st *state) object(m map[string]any) map[string]any {
	out := map[string]any{}
	kind, _ := m["kind"].(string)
	_, hasItems := m["items"]
	// A Table's resourceVersion is its list's (a global revision that other writers move) or,
	// for one object, that object's; both are compared as present or absent.
	isList := listRVKind.MatchString(kind) || (hasItems && kind == "") || kind == "Table"
	for k, x := range m {
		if k == "metadata" {
			if md, ok := x.(map[string]any); ok {
				out[k] = st.metadata(md, isList)
				continue
			}
		}
		out[k] = st.value(x, k)
	}
	return out
}

func (st *state) metadata(md map[string]any, isList bool) map[string]any {
	out := map[string]any{}
	for k, x := range md {
		switch k {
		case "resourceVersion":
			s, _ := x.(string)
			if isList {
				if s != "" && s == st.reqRV {
					out[k] = "<requested rv>"
				} else if s != "" {
					out[k] = "<rv>"
				} else {
					out[k] = ""
				}
			} else {
				out[k] = st.rvToken(s)
			}
		case "continue":
			if s, _ := x.(string); s != "" {
				out[k] = "<continue>"
			} else {
				out[k] = x
			}
		case "uid":
			out[k] = "<uid>"
		case "creationTimestamp", "deletionTimestamp":
			if x != nil {
				out[k] = "<time>"
			} else {
				out[k] = nil
			}
		case "name":
			name, _ := x.(string)
			if gen, _ := md["generateName"].(string); gen != "" && strings.HasPrefix(name, gen) && len(name) == len(gen)+5 {
				out[k] = gen + "<gen>"
			} else {
				out[k] = st.str(name)
			}
		case "managedFields":
			out[k] = sortManagedFields(st.value(x, k))
		default:
			out[k] = st.value(x, k)
		}
	}
	return out
}

// sortManagedFields orders entries by operation, manager and subresource. Both servers sort
// them by operation, time in seconds, manager; times are normalised away, and two writes a
// few milliseconds apart may fall in one second on one server and in two on the other.
func sortManagedFields(v any) any {
	entries, ok := v.([]any)
	if !ok {
		return v
	}
	key := func(e any) string {
		m, _ := e.(map[string]any)
		return fmt.Sprint(m["operation"], "\x00", m["manager"], "\x00", m["subresource"])
	}
	sorted := append([]any(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool { return key(sorted[i]) < key(sorted[j]) })
	return sorted
}
