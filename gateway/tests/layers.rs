//! The gateway's house, checked against its code: each layer is a folder that uses only the
//! layers before it, the modules inside a layer form no circle, the crate root defines
//! nothing, controllers never reach into `http/`, and `serve/` names no handler type. Every
//! path spelling counts: `crate::a::b`, grouped `crate::{a, b::c}`, `super::` (chained, and
//! naming an item), and items of the crate root. The checkers are plain functions over text,
//! so the last tests feed them a broken tree and expect them to object.
// Test code: a panic on a broken expectation is the point, and indexing on test data is
// checked by the assertions around it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: a module may use only its own layer and the ones before it.
const LAYERS: &[&str] = &[
    "base",
    "observe",
    "outbound",
    "registry",
    "security",
    "http",
    "serve",
    "controllers",
    "run",
];

/// Edges that are refused although they point down: `(from, to, why)`, each a module path
/// prefix.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "controllers",
        "http",
        "controllers call the registry or the loopback pipeline, never http/",
    ),
    ("serve", "http::rest", "serve/ names no handler type"),
];

/// One source file: its module path (`http::rest::write`, empty for the crate root) and text.
struct Module {
    path: String,
    text: String,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every file of the library (the binary's `main.rs` is a user of the crate, not a part).
fn modules() -> Vec<Module> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut out: Vec<Module> = files
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&root).ok()?.with_extension("");
            let path = rel.to_string_lossy().replace('/', "::");
            let path = match path.as_str() {
                "main" => return None,
                "lib" => String::new(),
                _ => path,
            };
            Some(Module {
                path,
                text: std::fs::read_to_string(&f).ok()?,
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Splits a `use` group's inside at its top-level commas.
fn split_group(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// The paths named by `text` (which follows a `crate::` or `super::` prefix), relative to
/// that prefix: `a::b::Item` gives `a::b::Item`, `{a, b::{c, D}}` gives `a`, `b::c`, `b::D`.
fn expand(text: &str) -> Vec<String> {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        let mut depth = 1usize;
        let mut end = group.len();
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        return split_group(&group[..end])
            .into_iter()
            .flat_map(expand)
            .collect();
    }
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
        .unwrap_or(text.len());
    let head = &text[..end];
    if let Some(i) = head.find("::{") {
        let prefix = &head[..i];
        return expand(&text[i + 2..])
            .into_iter()
            .map(|rest| format!("{prefix}::{rest}"))
            .collect();
    }
    vec![head.trim_end_matches(':').to_string()]
}

/// The module a named path points into: its leading lowercase segments (a path ending in an
/// item, `a::b::Item`, points into `a::b`; `self` is dropped). An empty result is the root.
fn module_of(path: &str) -> String {
    path.split("::")
        .filter(|s| *s != "self")
        .take_while(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join("::")
}

fn parent(module: &str) -> Option<String> {
    if module.is_empty() {
        return None;
    }
    Some(
        module
            .rsplit_once("::")
            .map_or(String::new(), |(p, _)| p.to_string()),
    )
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_string(),
        (_, true) => base.to_string(),
        _ => format!("{base}::{rest}"),
    }
}

/// Every module a file names through `crate::` or `super::`, as absolute module paths (the
/// empty string is the crate root). `super::` inside an inline `mod tests` block is resolved
/// from that block.
fn references(module: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut here = module.to_string();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        if code.trim_start().starts_with("mod tests {") {
            here = join(module, "tests");
        }
        for (prefix, is_crate) in [("crate::", true), ("super::", false)] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                let before = rest[..i].chars().last();
                let after = &rest[i + prefix.len()..];
                rest = after;
                // `crate::` inside a longer name (`svc_crate::`, `$crate::`).
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut base = if is_crate {
                    Some(String::new())
                } else {
                    parent(&here)
                };
                let mut tail = after;
                while !is_crate && let Some(t) = tail.strip_prefix("super::") {
                    base = base.as_deref().and_then(parent);
                    tail = t;
                }
                // The chain is read whole: scanning goes on after it.
                rest = tail;
                let Some(base) = base else {
                    out.push("<above the crate root>".to_string());
                    continue;
                };
                for path in expand(tail) {
                    out.push(join(&base, &module_of(&path)));
                }
            }
        }
    }
    out
}

fn layer_of(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer_of(module))
}

fn within(module: &str, prefix: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

/// Every reference that breaks the house: up a layer, into the root, to a module outside
/// every layer, or across a forbidden edge. As `from -> to (why)`, sorted.
fn violations(modules: &[Module]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for m in modules {
        if m.path.is_empty() {
            continue;
        }
        let Some(own) = rank(&m.path) else {
            out.insert(format!("{} is in no layer", m.path));
            continue;
        };
        for to in references(&m.path, &m.text) {
            if within(&to, &m.path) {
                continue;
            }
            if to.is_empty() {
                out.insert(format!("{} -> the crate root (it defines nothing)", m.path));
                continue;
            }
            match rank(&to) {
                None => {
                    out.insert(format!("{} -> {to} (in no layer)", m.path));
                }
                Some(r) if r > own => {
                    out.insert(format!("{} -> {to} (up a layer)", m.path));
                }
                Some(_) => {}
            }
            for (from, forbidden, why) in FORBIDDEN {
                if within(&m.path, from) && within(&to, forbidden) {
                    out.insert(format!("{} -> {to} ({why})", m.path));
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The lines of the crate root that are not a layer's `pub mod` declaration (doc comments and
/// blank lines aside).
fn root_definitions(lib: &str) -> Vec<String> {
    lib.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .filter(|l| {
            !l.strip_prefix("pub mod ")
                .and_then(|r| r.strip_suffix(';'))
                .is_some_and(|name| LAYERS.contains(&name))
        })
        .map(str::to_string)
        .collect()
}

/// The two-level unit a module belongs to (`http::rest` for `http::rest::write`).
fn unit(module: &str) -> String {
    module.split("::").take(2).collect::<Vec<_>>().join("::")
}

/// Circles among the units of one layer (`security::authn` → `security::authz` → back), each
/// as its members, found with Tarjan's strongly connected components.
fn circles(modules: &[Module]) -> Vec<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in modules.iter().filter(|m| m.path.contains("::")) {
        let from = unit(&m.path);
        edges.entry(from.clone()).or_default();
        for to in references(&m.path, &m.text) {
            let to = unit(&to);
            if to.contains("::") && to != from && layer_of(&to) == layer_of(&from) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    let names: Vec<String> = edges.keys().cloned().collect();
    let index: BTreeMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let adj: Vec<Vec<usize>> = names
        .iter()
        .map(|n| {
            edges[n]
                .iter()
                .filter_map(|t| index.get(t.as_str()).copied())
                .collect()
        })
        .collect();
    struct Tarjan<'a> {
        adj: &'a [Vec<usize>],
        idx: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.idx[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on[v] = true;
            for &w in &self.adj[v] {
                match self.idx[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.idx[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        adj: &adj,
        idx: vec![None; names.len()],
        low: vec![0; names.len()],
        on: vec![false; names.len()],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..names.len() {
        if t.idx[v].is_none() {
            t.visit(v);
        }
    }
    let mut out: Vec<Vec<String>> = t
        .out
        .into_iter()
        .map(|scc| {
            let mut s: Vec<String> = scc.into_iter().map(|i| names[i].clone()).collect();
            s.sort();
            s
        })
        .collect();
    out.sort();
    out
}

/// Names that mean HTTP: the registry layer uses none of them (in code; comments may).
const HTTP_NAMES: &[&str] = &[
    "http::",
    "hyper::",
    "h2::",
    "Response<",
    "StatusCode",
    "HeaderMap",
];

/// The lines of `layer`'s modules that name HTTP, as `module: line`.
fn http_in(layer: &str, modules: &[Module]) -> Vec<String> {
    let mut out = Vec::new();
    for m in modules.iter().filter(|m| within(&m.path, layer)) {
        for line in m.text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            if HTTP_NAMES.iter().any(|n| code.contains(n)) {
                out.push(format!("{}: {}", m.path, line.trim()));
            }
        }
    }
    out
}

#[test]
fn the_registry_names_no_http_type() {
    let found = http_in("registry", &modules());
    assert!(
        found.is_empty(),
        "the registry layer names HTTP: {found:#?}"
    );
}

#[test]
fn every_module_points_down_the_house() {
    let modules = modules();
    let v = violations(&modules);
    assert!(v.is_empty(), "the gateway's layers are broken: {v:#?}");
}

#[test]
fn the_crate_root_defines_nothing() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let defs = root_definitions(&lib);
    assert!(
        defs.is_empty(),
        "lib.rs may only declare the layers: {defs:#?}"
    );
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let layers: BTreeSet<&str> = LAYERS.iter().copied().collect();
    assert_eq!(declared, layers, "lib.rs declares every layer");
}

#[test]
fn no_circle_inside_a_layer() {
    let c = circles(&modules());
    assert!(c.is_empty(), "modules that depend on each other: {c:#?}");
}

fn module(path: &str, text: &str) -> Module {
    Module {
        path: path.to_string(),
        text: text.to_string(),
    }
}

#[test]
fn the_checkers_object_to_a_broken_tree() {
    let broken = vec![
        module("", "pub mod base;\npub fn helper() {}\n"),
        // Up a layer, through a group, and through a nested group.
        module(
            "base::flags",
            "use crate::{observe::metrics, base::query};\nuse crate::registry::{caches::{Caches, x}};",
        ),
        // An item of the crate root, spelled both ways.
        module(
            "observe::trace",
            "use crate::Later;\nfn f() { super::super::Later::x(); }",
        ),
        // `super::` chains that climb into another layer.
        module("registry::caches", "use super::super::http::respond;"),
        // A controller reaching a handler; `serve` naming one.
        module(
            "controllers::bootstrap",
            "use crate::http::rest::write::delete_all;",
        ),
        module(
            "serve::h2conn",
            "use crate::http::rest::watch::WatchStream; // was here",
        ),
        // Allowed: down a layer, inside a layer, `super::*` in a test block, comments.
        module(
            "http::rest::write",
            "use super::call::Call;\nuse crate::registry::caches::Caches;\n// crate::serve::app\nmod tests {\n    use super::*;\n}",
        ),
        module("elsewhere", "fn f() {}"),
    ];
    assert_eq!(
        violations(&broken),
        vec![
            "base::flags -> observe::metrics (up a layer)",
            "base::flags -> registry::caches (up a layer)",
            // A lowercase last segment may be a function: it is reported as named.
            "base::flags -> registry::caches::x (up a layer)",
            "controllers::bootstrap -> http::rest::write::delete_all (controllers call the registry or the \
             loopback pipeline, never http/)",
            "elsewhere is in no layer",
            "observe::trace -> the crate root (it defines nothing)",
            "registry::caches -> http::respond (up a layer)",
            "serve::h2conn -> http::rest::watch (serve/ names no handler type)",
        ]
    );
    assert_eq!(
        root_definitions("//! doc\npub mod base;\npub mod nowhere;\npub use base::X;\n"),
        vec!["pub mod nowhere;", "pub use base::X;"]
    );
    let http = vec![
        module("registry::write", "use http::StatusCode; // returns a code"),
        module("registry::read", "// a Response<Body> is the handler's"),
        module("http::rest", "use http::StatusCode;"),
    ];
    assert_eq!(
        http_in("registry", &http),
        vec!["registry::write: use http::StatusCode; // returns a code"]
    );
    let circle = vec![
        module("security::authn", "use crate::security::authz::Attributes;"),
        module("security::authz", "use super::authn::ConnIdentity;"),
        module("security::authz::load", "use crate::security::jwt;"),
        module("security::jwt", "fn f() {}"),
    ];
    assert_eq!(
        circles(&circle),
        vec![vec![
            "security::authn".to_string(),
            "security::authz".to_string()
        ]]
    );
}

#[test]
fn paths_are_read_in_every_spelling() {
    assert_eq!(
        references("a::b", "use crate::{x::{y, Z}, w};"),
        vec!["x::y", "x", "w"]
    );
    assert_eq!(references("a::b::c", "super::super::Item"), vec!["a"]);
    assert_eq!(references("a::b", "use super::Item;"), vec!["a"]);
    assert_eq!(
        references("a", "super::super::x"),
        vec!["<above the crate root>"]
    );
    assert_eq!(references("a", "use svc_crate::x;"), Vec::<String>::new());
}
