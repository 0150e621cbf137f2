//! The invariants ARCHITECTURE.md states, checked against the code: which crate may depend
//! on which (storage, then cel, core and config, one way), what core, cel, config and storage
//! may never name, and that a kind is one file and one registry line (the gateway's layers
//! have their own test, `gateway/tests/layers.rs`). Each checker is a plain function over
//! text, so the tests below also feed it a deliberately broken input and expect it to object.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ sits in the workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The names under `[dependencies]` (not dev- or build-) of a Cargo.toml, with their lines.
fn normal_dependencies(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == "[dependencies]";
            continue;
        }
        if inside && let Some((name, _)) = t.split_once('=') {
            let name = name.trim().trim_end_matches(".workspace").to_string();
            if !name.is_empty() && !name.starts_with('#') {
                out.push((name, t.to_string()));
            }
        }
    }
    out
}

/// Dependencies of `manifest` that the rule forbids: any name in `forbidden`, or any crate of
/// ours (`svc-*`) other than those in `ours_allowed`.
fn forbidden_dependencies(
    manifest: &str,
    forbidden: &[&str],
    ours_allowed: &[&str],
) -> Vec<String> {
    normal_dependencies(manifest)
        .into_iter()
        .filter(|(name, _)| {
            forbidden.contains(&name.as_str())
                || (name.starts_with("svc-") && !ours_allowed.contains(&name.as_str()))
        })
        .map(|(_, line)| line)
        .collect()
}

/// Lines of the `.rs` files under `dir` that name any of `patterns`.
fn forbidden_names(dir: &Path, patterns: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for p in patterns {
                if code.contains(p) {
                    out.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    out
}

fn manifest(krate: &str) -> String {
    std::fs::read_to_string(root().join(krate).join("Cargo.toml")).expect("manifest")
}

#[test]
fn storage_knows_no_objects_and_no_http() {
    let bad = forbidden_dependencies(
        &manifest("storage"),
        &["http", "hyper", "serde_json", "prometheus-client"],
        &[],
    );
    assert!(bad.is_empty(), "storage depends on {bad:?}");
    let names = forbidden_names(&root().join("storage/src"), &["svc_core", "serde_json"]);
    assert!(names.is_empty(), "storage names objects: {names:#?}");
    // The etcd client speaks gRPC, which rides on HTTP/2; nothing else in storage may.
    let mut http = forbidden_names(&root().join("storage/src"), &["hyper::", "http::"]);
    let etcd = root().join("storage/src/etcd");
    http.retain(|line| !line.starts_with(&etcd.display().to_string()));
    assert!(
        http.is_empty(),
        "storage outside the etcd client speaks HTTP: {http:#?}"
    );
}

/// What the sans-IO crates (cel, core, config) never depend on.
const IO_CRATES: &[&str] = &[
    "http",
    "hyper",
    "h2",
    "tokio",
    "tokio-rustls",
    "redb",
    "tonic",
];

/// What the sans-IO crates never name in their sources.
const IO_NAMES: &[&str] = &[
    "hyper::",
    "http::",
    "tokio::",
    "std::net",
    "std::fs",
    "svc_storage::embedded",
    "svc_storage::etcd",
    "Store>",
    "dyn Store",
];

/// Which of our crates each crate below the gateway may depend on: storage and cel stand on
/// nothing of ours, core on storage's contract and cel, config on core and cel. So the
/// arrows point one way, and core never learns about configuration.
const CRATE_RULES: &[(&str, &[&str])] = &[
    ("storage", &[]),
    ("cel", &[]),
    ("core", &["svc-storage", "svc-cel"]),
    ("config", &["svc-core", "svc-cel"]),
];

#[test]
fn core_knows_no_http_no_sockets_no_disks_and_no_backend() {
    for (krate, allowed) in CRATE_RULES {
        // Storage is below the object model, not sans-IO: only its arrows to our crates are
        // checked here (its own test covers the rest).
        let io = if *krate == "storage" {
            &[][..]
        } else {
            IO_CRATES
        };
        let bad = forbidden_dependencies(&manifest(krate), io, allowed);
        assert!(bad.is_empty(), "{krate} depends on {bad:?}");
        if *krate == "storage" {
            continue;
        }
        let names = forbidden_names(&root().join(krate).join("src"), IO_NAMES);
        assert!(
            names.is_empty(),
            "{krate} reaches beyond its bounds: {names:#?}"
        );
    }
    // The crates' sources name only the crates their manifests allow.
    let names = forbidden_names(&root().join("core/src"), &["svc_config"]);
    assert!(names.is_empty(), "core names configuration: {names:#?}");
    let names = forbidden_names(&root().join("cel/src"), &["svc_core", "svc_config"]);
    assert!(names.is_empty(), "cel names our other crates: {names:#?}");
}

/// Lines of production code (test files and `#[cfg(test)]` modules left out) under `dir`
/// that name any of `patterns`, except in the files `allowed` (paths under `dir`).
fn ambient_reads(dir: &Path, patterns: &[&str], allowed: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let mut out = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(dir)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        if allowed.contains(&rel.as_str()) || rel.ends_with("tests.rs") || rel.contains("tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (i, line) in production.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if patterns.iter().any(|p| code.contains(p)) {
                out.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

/// Where core may meet the world: `ambient.rs` (the real `Ambient`) and the `now()`
/// constructors of `meta.rs`'s time types, which the gateway calls.
const AMBIENT_READS: &[&str] = &[
    "now_utc",
    "Time::now()",
    "SystemTime",
    "Instant::now",
    "Uuid::new_v4",
    "rand::",
];

#[test]
fn core_takes_time_uids_and_randomness_from_its_caller() {
    let found = ambient_reads(
        &root().join("core/src"),
        AMBIENT_READS,
        &["ambient.rs", "meta.rs"],
    );
    assert!(
        found.is_empty(),
        "core reads the clock or draws entropy itself (take an Ambient or a time): {found:#?}"
    );
    for krate in ["cel", "config"] {
        let found = ambient_reads(&root().join(krate).join("src"), AMBIENT_READS, &[]);
        assert!(
            found.is_empty(),
            "{krate} reads the clock or draws entropy: {found:#?}"
        );
    }

    let dir = std::env::temp_dir().join(format!("svc-ambient-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("object.rs"),
        "//! x\nfn f() { let _ = Time::now(); }\n#[cfg(test)]\nmod t { fn g() { Time::now(); } }\n",
    )
    .unwrap();
    let found = ambient_reads(&dir, AMBIENT_READS, &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
}

#[test]
fn loadtest_links_no_crate_of_ours() {
    let bad = forbidden_dependencies(&manifest("loadtest"), &[], &[]);
    assert!(bad.is_empty(), "loadtest depends on {bad:?}");
    let names = forbidden_names(
        &root().join("loadtest/src"),
        &["svc_core", "svc_storage", "svc_gateway"],
    );
    assert!(names.is_empty(), "loadtest names our crates: {names:#?}");
}

#[test]
fn the_checkers_object_to_broken_inputs() {
    let bad_core = "[dependencies]\nhyper.workspace = true\nsvc-gateway.workspace = true\n\
                    serde.workspace = true\n[dev-dependencies]\nhttp = \"1\"\n";
    assert_eq!(
        forbidden_dependencies(bad_core, &["hyper", "http"], &["svc-storage"]),
        vec!["hyper.workspace = true", "svc-gateway.workspace = true"]
    );
    // cel reaching up to core (a circle through core's match conditions) is refused.
    let bad_cel = "[dependencies]\nsvc-core.workspace = true\nregex = \"1\"\n";
    let cel_rule = CRATE_RULES.iter().find(|(k, _)| *k == "cel").unwrap().1;
    assert_eq!(
        forbidden_dependencies(bad_cel, IO_CRATES, cel_rule),
        vec!["svc-core.workspace = true"]
    );

    let dir = std::env::temp_dir().join(format!("svc-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.rs"),
        "//! x\nuse hyper::Body; // hyper:: in a comment is fine\n// http::\n",
    )
    .unwrap();
    let found = forbidden_names(&dir, &["hyper::", "http::"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
}

/// The kinds declared in `core/src/kinds/`, as `(group, kind)` (`kind: "ServiceAccount",` in
/// an INFO, and the `group:` just before it, a literal or a `const` of the same file).
fn declared_kinds() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("core/src/kinds"), &mut files);
    let mut kinds = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // `kind: "Secret",` opening a ResourceInfo (not a subresource's `kind`, nor
            // `kind: "Pod".into(),` in a test).
            let before = &lines[i.saturating_sub(4)..i];
            let in_info = before.iter().any(|l| l.contains("ResourceInfo {"));
            if in_info
                && let Some(rest) = line.trim().strip_prefix("kind: \"")
                && let Some((name, ",")) = rest.split_once('"')
            {
                // A kind with no verbs is a subresource's body (`TokenRequest`), not served
                // on its own, so it has no registry line.
                let subresource_only = lines[i..lines.len().min(i + 12)]
                    .iter()
                    .any(|l| l.trim() == "verbs: &[],");
                if !subresource_only {
                    let group = before
                        .iter()
                        .find_map(|l| l.trim().strip_prefix("group: "))
                        .map(|g| g.trim_end_matches(','))
                        .and_then(|g| string_literal(g).or_else(|| const_str(&text, g)))
                        .unwrap_or_else(|| panic!("{}: the group of {name}", f.display()));
                    kinds.push((group, name.to_string()));
                }
            }
        }
    }
    kinds
}

/// The text of a string literal without escapes (`"apps"`), else None.
fn string_literal(s: &str) -> Option<String> {
    let inner = s.trim().strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains(['"', '\\'])).then(|| inner.to_string())
}

/// The value of `const NAME: &str = "...";` in `text`.
fn const_str(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().trim_start_matches("pub ").strip_prefix("const ")?;
        let value = rest.strip_prefix(name)?.trim().strip_prefix(": &str =")?;
        string_literal(value.trim().strip_suffix(';')?)
    })
}

/// Lines that branch on a served kind: its name as a match arm (`"ServiceAccount" =>`, `"Secret"
/// |`), its `(group, kind)` as a tuple (`("", "Secret") =>`, or a table's row `("", "Secret",
/// FIELDS)`), or its name in a tuple arm over any group (`(_, "Secret") =>`): a per-kind
/// table. A tuple whose first string is not the kind's group (`("v1", "ServiceAccount")`, an
/// apiVersion; `("", "Event")`, Kubernetes' core Event, not `events.svc.io`'s) is not one.
fn per_kind_tables(kinds: &[(String, String)], files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let arm = kinds.iter().any(|(_, k)| {
                code.contains(&format!("\"{k}\" =>")) || code.contains(&format!("\"{k}\" |"))
            });
            if arm || tuple_on_a_kind(kinds, code) {
                out.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

/// Whether `code` holds a tuple naming a served kind (see `per_kind_tables`).
fn tuple_on_a_kind(kinds: &[(String, String)], code: &str) -> bool {
    code.match_indices('(').any(|(open, _)| {
        // A call's or a macro's arguments are not a tuple.
        if code[..open]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '!' || c == '>')
        {
            return false;
        }
        let inside = &code[open + 1..];
        let Some(close) = inside.find(')') else {
            return false;
        };
        let elems: Vec<&str> = inside[..close].split(',').map(str::trim).collect();
        let (Some(first), Some(Some(kind))) =
            (elems.first(), elems.get(1).map(|e| string_literal(e)))
        else {
            return false;
        };
        match string_literal(first) {
            Some(group) => kinds.iter().any(|(g, k)| *g == group && *k == kind),
            None => {
                let after = inside[close + 1..].trim_start();
                let any_group = *first == "_"
                    || first.chars().all(|c| c.is_alphanumeric() || c == '_') && !first.is_empty();
                any_group
                    && elems.len() == 2
                    && (after.starts_with("=>") || after.starts_with('|'))
                    && kinds.iter().any(|(_, k)| *k == kind)
            }
        }
    })
}

#[test]
fn a_kind_is_one_file_and_one_registry_line() {
    let kinds = declared_kinds();
    for expected in [("", "ServiceAccount"), ("", "Namespace")] {
        assert!(
            kinds
                .iter()
                .any(|(g, k)| (g.as_str(), k.as_str()) == expected),
            "{kinds:?}"
        );
    }
    assert!(
        kinds.iter().any(
            |(g, k)| g == "admissionregistration.svc.io" && k == "MutatingWebhookConfiguration"
        ),
        "a group from a const: {kinds:?}"
    );
    let mut files = Vec::new();
    for dir in ["cel/src", "core/src", "config/src", "gateway/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let kinds_dir = root().join("core/src/kinds");
    let sources: Vec<(String, String)> = files
        .into_iter()
        .filter(|f| !f.starts_with(&kinds_dir))
        .map(|f| {
            (
                f.display().to_string(),
                std::fs::read_to_string(&f).unwrap_or_default(),
            )
        })
        .collect();
    let tables = per_kind_tables(&kinds, &sources);
    assert!(
        tables.is_empty(),
        "per-kind tables outside core/src/kinds (declare it in the kind's file instead): {tables:#?}"
    );
    let registry = std::fs::read_to_string(root().join("core/src/registry.rs")).unwrap();
    // The invocation, however rustfmt wraps it.
    let start = registry
        .find("\nkinds!(")
        .expect("the registry's kinds! invocation");
    let line = &registry[start..start + registry[start..].find(");").unwrap_or(0)];
    for (_, k) in &kinds {
        assert!(
            line.contains(k.as_str()),
            "{k} is declared but not registered: {line}"
        );
    }

    let broken = vec![(
        "gateway/src/openapi.rs".to_string(),
        "match kind {\n    \"ServiceAccount\" => json!({}),\n    _ => json!({}),\n}".to_string(),
    )];
    assert_eq!(per_kind_tables(&kinds, &broken).len(), 1);
    // Tuple patterns: a match on (group, kind), on any group, and a table's rows.
    let tuples = vec![(
        "core/src/watch/unstructured.rs".to_string(),
        [
            "match (group, kind) {",
            "    (\"\", \"Secret\") => SECRET_FIELDS,",
            "    (\"\", \"Pod\") | (\"\", \"Namespace\") => X,",
            "    (_, \"ServiceAccount\") => Y,",
            "    (\"\", \"Event\") => EVENT_FIELDS, // Kubernetes' core Event, not ours",
            "    (\"v1\", \"ServiceAccount\") if false => Z, // an apiVersion",
            "}",
            "const T: &[(&str, &str, &[&str])] = &[(\"certificates.svc.io\", \"CertificateSigningRequest\", &[])];",
            "assert_eq!(kind_of(x), (\"v1\", \"ServiceAccount\"));",
            "assert!(supports_field(\"\", \"Secret\", \"type\"));",
        ]
        .join("\n"),
    )];
    assert_eq!(
        per_kind_tables(&kinds, &tuples)
            .iter()
            .map(|l| l.split(':').nth(1).unwrap().to_string())
            .collect::<Vec<_>>(),
        vec!["2", "3", "4", "8"]
    );
}

/// Source files ARCHITECTURE.md does not name (as `path/under/src.rs`). Test modules and
/// generated code are exempt; crate roots are named as `lib.rs`/`main.rs` of their crate.
fn unmapped_files(doc: &str, crates: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for krate in crates {
        let src = root().join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let rel = f
                .strip_prefix(&src)
                .unwrap_or(&f)
                .to_string_lossy()
                .replace('\\', "/");
            let name = rel.rsplit('/').next().unwrap_or(&rel);
            let exempt = name == "tests.rs"
                || rel.contains("/tests/")
                || rel.starts_with("etcd/pb/")
                || rel == "lib.rs"
                || rel == "main.rs";
            if !exempt && !doc.contains(&format!("`{rel}`")) && !doc.contains(&format!("/{rel}`")) {
                out.push(format!("{krate}/src/{rel}"));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_architecture_page_names_every_source_file() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let missing = unmapped_files(
        &doc,
        &["storage", "cel", "core", "config", "gateway", "loadtest"],
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not mention: {missing:#?}"
    );
    assert!(
        !unmapped_files("", &["gateway"]).is_empty(),
        "the check must be able to fail"
    );
}
