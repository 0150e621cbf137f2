//! The gateway's house, checked against its code: each layer is a folder that uses only the
//! layers before it, the modules inside a layer form no circle, the crate root defines
//! nothing, controllers never reach into `http/`, and `serve/` names no handler type. Files
//! are read whole, as tokens (comments and literals left out): `use` items in every form
//! (groups nested and wrapped over lines, `self`, `super` chains, globs, renames, `pub use`),
//! paths in code (`crate::a::f()`, `super::super::X`), paths through a name an import binds
//! (`rest::Thing` after `use crate::http::rest;`), re-exports followed to what they name,
//! inline modules, and items of the crate root. The checkers are plain functions over text,
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

/// Edges that are refused although they point down: `(from, to, except, why)`, `from` and
/// `to` each a module path prefix, `except` the paths under `to` that `from` may still name.
const FORBIDDEN: &[(&str, &str, &[&str], &str)] = &[
    (
        "controllers",
        "http",
        &[],
        "controllers call the registry or the loopback pipeline, never http/",
    ),
    // The pipeline hands a resource request to the handlers through their one entry point,
    // `http::rest::serve`, a function taking the request's parts: that call is the edge
    // serve/ -> http/ is for. Every type, module or other item of `http::rest` is refused.
    (
        "serve",
        "http::rest",
        &["http::rest::serve"],
        "serve/ names no handler type",
    ),
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

/// The tokens of Rust source that paths are made of: identifiers (and numbers), `::`, and
/// every other character on its own. Comments are dropped (nested block comments too), every
/// string, byte string, raw string or character literal is one `""` token, so that a path
/// written in one is not read, and a lifetime is `'` followed by its name.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(c) = at(i) {
        let next = at(i + 1);
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while let Some(c) = at(i) {
                if c == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            out.push("\"\"".to_string());
            i = end;
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            i += if c == 'b' { 2 } else { 1 };
            while let Some(c) = at(i) {
                i += 1;
                match c {
                    '\\' => i += 1,
                    '"' => break,
                    _ => {}
                }
            }
            out.push("\"\"".to_string());
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            let quote = if c == 'b' { i + 1 } else { i };
            if at(quote + 1) == Some('\\') {
                // An escape: the escaped character, then up to the closing quote.
                i = quote + 3;
                while at(i).is_some_and(|c| c != '\'') {
                    i += 1;
                }
                i += 1;
                out.push("\"\"".to_string());
            } else if at(quote + 2) == Some('\'') {
                i = quote + 3;
                out.push("\"\"".to_string());
            } else {
                out.push("'".to_string());
                i = quote + 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while at(i).is_some_and(|c| c.is_alphanumeric() || c == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Where a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` ends, if one does.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|c| **c == '#').count();
    j += hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        let closing = chars[j + 1..].iter().take_while(|c| **c == '#').count();
        if chars[j] == '"' && closing >= hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// What a leaf of a `use` tree brings into scope.
enum Bind {
    /// A name (the last segment, the prefix's for `self`, or what follows `as`).
    Name(String),
    /// Everything the path's module holds (`*`).
    Glob,
    /// Nothing nameable (`as _`).
    Hidden,
}

/// The leaves of the `use` tree that starts at `toks[*k]`, each as its whole path (a leaf
/// `self` names its prefix) and what it binds; `*k` is left after the tree.
fn use_tree(toks: &[String], k: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, Bind)>) {
    let mut segs = prefix.to_vec();
    while let Some(t) = toks.get(*k) {
        match t.as_str() {
            // A leading `::`: a path from the extern prelude.
            "::" if segs.is_empty() => {
                segs.push("::".to_string());
                *k += 1;
            }
            "{" => {
                *k += 1;
                while let Some(t) = toks.get(*k) {
                    match t.as_str() {
                        "}" => {
                            *k += 1;
                            return;
                        }
                        ";" => return,
                        "," => *k += 1,
                        _ => {
                            let before = *k;
                            use_tree(toks, k, &segs, out);
                            if *k == before {
                                *k += 1;
                            }
                        }
                    }
                }
                return;
            }
            "*" => {
                *k += 1;
                out.push((segs, Bind::Glob));
                return;
            }
            t if is_ident(t) => {
                *k += 1;
                if toks.get(*k).is_some_and(|n| n == "::") {
                    segs.push(t.to_string());
                    *k += 1;
                    continue;
                }
                let mut name = if t == "self" {
                    segs.last().cloned().unwrap_or_default()
                } else {
                    segs.push(t.to_string());
                    t.to_string()
                };
                if toks.get(*k).is_some_and(|n| n == "as") {
                    name = toks.get(*k + 1).cloned().unwrap_or_default();
                    *k += 2;
                }
                let bind = if name == "_" {
                    Bind::Hidden
                } else {
                    Bind::Name(name)
                };
                out.push((segs, bind));
                return;
            }
            _ => return,
        }
    }
}

/// What one module scope (a file, or an inline `mod name { … }` inside one) declares.
#[derive(Default)]
struct Scope {
    /// The names its `use` items bind, each to its path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// The paths of its glob imports, as written.
    globs: Vec<Vec<String>>,
    /// Its child modules (`mod name;` and `mod name { … }`).
    children: BTreeSet<String>,
}

/// A path a file names: the file's module, the scope it is written in, its segments as
/// written.
struct Named {
    file: String,
    scope: String,
    segs: Vec<String>,
}

/// How a path resolves.
enum Resolved {
    /// An absolute path of the crate (empty: the crate root).
    At(Vec<String>),
    /// `super::` past the crate root.
    AboveRoot,
    /// Another crate, or a name not known here (a local, a prelude item).
    Outside,
}

/// The crate as far as paths go: every scope with its imports, and every path named.
struct Crate {
    scopes: BTreeMap<String, Scope>,
    named: Vec<Named>,
}

/// How deep one resolution may go through imports (a circle of imports does not compile).
const FUEL: usize = 32;

fn segments(module: &str) -> Vec<String> {
    if module.is_empty() {
        return Vec::new();
    }
    module.split("::").map(str::to_string).collect()
}

impl Crate {
    /// Reads every file whole: `use` items (groups nested and wrapped over lines, `self`,
    /// `super` chains, globs, renames, any visibility), inline modules, and every other path
    /// in the code (`crate::a::f()`, `super::super::X`, and paths through a name an import
    /// binds: `rest::Thing` after `use crate::http::rest;`).
    fn read(modules: &[Module]) -> Crate {
        let mut scopes: BTreeMap<String, Scope> = BTreeMap::new();
        let mut named = Vec::new();
        for m in modules {
            let toks = tokens(&m.text);
            let mut here = m.path.clone();
            scopes.entry(here.clone()).or_default();
            // The scopes of the inline modules around, with the depth each one closes at.
            let mut open: Vec<(String, usize)> = Vec::new();
            let mut depth = 0usize;
            let mut k = 0;
            while let Some(t) = toks.get(k) {
                let prev = k
                    .checked_sub(1)
                    .and_then(|p| toks.get(p))
                    .map(String::as_str);
                let next = toks.get(k + 1).map(String::as_str);
                match t.as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth = depth.saturating_sub(1);
                        if open.last().is_some_and(|(_, d)| *d == depth) {
                            here = open.pop().unwrap().0;
                        }
                    }
                    "mod" if next.is_some_and(is_ident) => {
                        let name = toks[k + 1].clone();
                        scopes
                            .entry(here.clone())
                            .or_default()
                            .children
                            .insert(name.clone());
                        if toks.get(k + 2).is_some_and(|t| t == "{") {
                            open.push((here.clone(), depth));
                            here = join(&here, &name);
                            scopes.entry(here.clone()).or_default();
                            depth += 1;
                            k += 3;
                            continue;
                        }
                    }
                    "use" => {
                        k += 1;
                        let mut leaves = Vec::new();
                        use_tree(&toks, &mut k, &[], &mut leaves);
                        let scope = scopes.entry(here.clone()).or_default();
                        for (segs, bind) in leaves {
                            match bind {
                                Bind::Name(n) => {
                                    scope.uses.insert(n, segs.clone());
                                }
                                Bind::Glob => scope.globs.push(segs.clone()),
                                Bind::Hidden => {}
                            }
                            named.push(Named {
                                file: m.path.clone(),
                                scope: here.clone(),
                                segs,
                            });
                        }
                        while toks.get(k).is_some_and(|t| t != ";") {
                            k += 1;
                        }
                        continue;
                    }
                    t if is_ident(t)
                        && next == Some("::")
                        && !matches!(prev, Some("::" | "$" | ".")) =>
                    {
                        let mut segs = vec![t.to_string()];
                        k += 2;
                        while let Some(s) = toks.get(k).filter(|s| is_ident(s)) {
                            segs.push(s.clone());
                            if toks.get(k + 1).is_some_and(|t| t == "::") {
                                k += 2;
                            } else {
                                k += 1;
                                break;
                            }
                        }
                        named.push(Named {
                            file: m.path.clone(),
                            scope: here.clone(),
                            segs,
                        });
                        continue;
                    }
                    _ => {}
                }
                k += 1;
            }
        }
        Crate { scopes, named }
    }

    /// Resolves `segs`, written in `scope`, to an absolute path.
    fn resolve(&self, scope: &str, segs: &[String], fuel: usize) -> Resolved {
        let mut base = segments(scope);
        let mut i = 1;
        match segs.first().map(String::as_str) {
            None | Some("::") => return Resolved::Outside,
            Some("crate") => base.clear(),
            Some("self") => {}
            Some("super") => {
                i = 0;
                while segs.get(i).is_some_and(|s| s == "super") {
                    if base.pop().is_none() {
                        return Resolved::AboveRoot;
                    }
                    i += 1;
                }
            }
            Some(name) => match self.lookup(scope, name, fuel) {
                Some(found) => base = found,
                None => return Resolved::Outside,
            },
        }
        base.extend(segs[i..].iter().cloned());
        Resolved::At(base)
    }

    /// What `name` means in `scope`: an import, a child module, or a name a glob import
    /// brings (every name of the glob's module counts, its private imports too).
    fn lookup(&self, scope: &str, name: &str, fuel: usize) -> Option<Vec<String>> {
        let fuel = fuel.checked_sub(1)?;
        let s = self.scopes.get(scope)?;
        if let Some(target) = s.uses.get(name) {
            return match self.resolve(scope, target, fuel) {
                Resolved::At(p) => Some(p),
                _ => None,
            };
        }
        if s.children.contains(name) {
            return Some(segments(&join(scope, name)));
        }
        s.globs
            .iter()
            .find_map(|g| match self.resolve(scope, g, fuel) {
                Resolved::At(m) => self.lookup(&m.join("::"), name, fuel),
                _ => None,
            })
    }

    /// The path an absolute path stands for once every import it goes through is followed:
    /// `http::api::Thing` is `http::rest::Thing` where `http/api.rs` has
    /// `pub use crate::http::rest::Thing;`.
    fn canonical(&self, path: Vec<String>, fuel: usize) -> Vec<String> {
        let Some(fuel) = fuel.checked_sub(1) else {
            return path;
        };
        for k in 1..=path.len() {
            let module = path[..k - 1].join("::");
            let Some(target) = self
                .scopes
                .get(&module)
                .and_then(|s| s.uses.get(&path[k - 1]))
            else {
                continue;
            };
            if let Resolved::At(mut to) = self.resolve(&module, target, fuel) {
                to.extend(path[k..].iter().cloned());
                return self.canonical(to, fuel);
            }
        }
        path
    }

    /// Every module each file names, as absolute module paths (the empty string is the crate
    /// root), in the order written: a path through imports counts as what it names as written
    /// and as what it stands for.
    fn references(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for n in &self.named {
            let refs = out.entry(n.file.clone()).or_default();
            match self.resolve(&n.scope, &n.segs, FUEL) {
                Resolved::At(path) => {
                    let written = module_of(&path.join("::"));
                    let meant = module_of(&self.canonical(path, FUEL).join("::"));
                    if meant != written {
                        refs.push(meant);
                    }
                    refs.push(written);
                }
                Resolved::AboveRoot => refs.push("<above the crate root>".to_string()),
                Resolved::Outside => {}
            }
        }
        out
    }
}

/// The module a named path points into: its leading lowercase segments (a path ending in an
/// item, `a::b::Item`, points into `a::b`). An empty result is the root.
fn module_of(path: &str) -> String {
    path.split("::")
        .take_while(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join("::")
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_string(),
        (_, true) => base.to_string(),
        _ => format!("{base}::{rest}"),
    }
}

/// Every module one file names (see `Crate::references`), read alone.
fn references(module: &str, text: &str) -> Vec<String> {
    let file = Module {
        path: module.to_string(),
        text: text.to_string(),
    };
    Crate::read(&[file])
        .references()
        .remove(module)
        .unwrap_or_default()
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
    let references = Crate::read(modules).references();
    let mut out = BTreeSet::new();
    for m in modules {
        if m.path.is_empty() {
            continue;
        }
        let Some(own) = rank(&m.path) else {
            out.insert(format!("{} is in no layer", m.path));
            continue;
        };
        for to in references.get(&m.path).into_iter().flatten() {
            if within(to, &m.path) {
                continue;
            }
            if to.is_empty() {
                out.insert(format!("{} -> the crate root (it defines nothing)", m.path));
                continue;
            }
            match rank(to) {
                None => {
                    out.insert(format!("{} -> {to} (in no layer)", m.path));
                }
                Some(r) if r > own => {
                    out.insert(format!("{} -> {to} (up a layer)", m.path));
                }
                Some(_) => {}
            }
            for (from, forbidden, except, why) in FORBIDDEN {
                if within(&m.path, from) && within(to, forbidden) && !except.contains(&to.as_str())
                {
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
    let references = Crate::read(modules).references();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in modules.iter().filter(|m| m.path.contains("::")) {
        let from = unit(&m.path);
        edges.entry(from.clone()).or_default();
        for to in references.get(&m.path).into_iter().flatten() {
            let to = unit(to);
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

#[test]
fn whole_use_statements_are_read() {
    // rustfmt's wrapped group, nested, over several lines: the layer it crosses is seen.
    let wrapped = vec![module(
        "observe::metrics",
        "use crate::{\n    base::flags,\n    registry::{\n        caches::Caches,\n        write::{self, commit},\n    },\n};\n",
    )];
    assert_eq!(
        violations(&wrapped),
        vec![
            "observe::metrics -> registry::caches (up a layer)",
            "observe::metrics -> registry::write (up a layer)",
            "observe::metrics -> registry::write::commit (up a layer)",
        ]
    );
    // `pub use`, `pub(crate) use` with a `super` chain, a glob, a rename, `self` in a group.
    assert_eq!(
        references(
            "a::b",
            "pub use crate::x::Y;\npub(crate) use super::super::{w::*, v::{self as vv}};\nuse \
             self::c::D;"
        ),
        vec!["x", "w", "v", "a::b::c"]
    );
    // A path through a name an import binds, and a leading `::` (another crate).
    assert_eq!(
        references(
            "a",
            "use crate::m::{self as n};\nfn f() { n::k::F::new(); ::std::mem::drop(1); }"
        ),
        vec!["m", "m::k"]
    );
    // Paths in comments, strings and characters are not read; lifetimes do not confuse it.
    assert_eq!(
        references(
            "a",
            "/* crate::x /* nested */ crate::y */ fn f<'a>(s: &'a str) { let _ = \
             \"crate::z\"; let _ = r#\"crate::\"q\"#; let _ = '\\''; crate::w::g(); }"
        ),
        vec!["w::g"]
    );
    // `super` from an inline module is read from that module.
    assert_eq!(
        references(
            "a::b",
            "mod inner {\n    use super::super::c;\n}\nuse super::d;"
        ),
        vec!["a::c", "a::d"]
    );
    // A forbidden item reached through a name bound to its module, or through a re-export,
    // is refused; the handlers' one entry point is not.
    let serve = vec![
        module(
            "serve::pipeline",
            "use crate::http;\nfn f() { http::rest::RestRequest::new(); }",
        ),
        module("serve::loopback", "use crate::http::api::Call;"),
        module(
            "serve::app",
            "use crate::http::rest::serve as serve_resource;",
        ),
        module("http::api", "pub use super::rest::Call;"),
    ];
    assert_eq!(
        violations(&serve),
        vec![
            "serve::loopback -> http::rest (serve/ names no handler type)",
            "serve::pipeline -> http::rest (serve/ names no handler type)",
        ]
    );
}
