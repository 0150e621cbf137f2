//! `svc-gateway validate-config FILE...`: checks configuration files of every kind the core
//! catalog knows (by `apiVersion` and `kind`, YAML or JSON, one document after another in
//! multi-document YAML), printing each error with its field path, or each document with its
//! defaults applied (`--print-defaults`). The server runs the same core code on its own files.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::PathBuf;

use serde_json::{Value, json};
use svc_config::{ConfigError, catalog, parse_document, type_meta};

/// Files larger than this are refused unread: configuration files are small, and the whole
/// file is held in memory.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// `file: kind: field: message` lines.
    Text,
    /// A JSON array for tools.
    Json,
}

/// The flags of `validate-config`.
#[derive(Clone, Debug, clap::Args)]
pub struct ValidateArgs {
    /// Files to check: YAML (several documents separated by `---`) or JSON.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,

    /// Print each valid document with its defaults applied (YAML, or a JSON array with
    /// `-o json`); errors go to stderr.
    #[arg(long)]
    pub print_defaults: bool,
}

/// The verdict on one document.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The file, with `#N` when it holds several documents.
    pub label: String,
    pub file: String,
    /// 1-based position in the file.
    pub document: usize,
    pub kind: String,
    /// The defaulted document, or every error found.
    pub result: Result<Value, ConfigError>,
}

/// What to print and how to exit.
#[derive(Debug, Default)]
pub struct Report {
    pub stdout: String,
    pub stderr: String,
    pub ok: bool,
}

/// Runs the subcommand; the caller prints the report and exits 0 when `ok`, else 1.
pub fn run(args: &ValidateArgs) -> Report {
    let checked: Vec<Checked> = args.files.iter().flat_map(check_file).collect();
    let ok = checked.iter().all(|c| c.result.is_ok());
    let mut report = Report {
        ok,
        ..Report::default()
    };
    let errors_text = text_lines(&checked, false);
    match (args.print_defaults, args.output) {
        (false, Output::Text) => report.stdout = text_lines(&checked, true),
        (false, Output::Json) => report.stdout = json_report(&checked),
        (true, output) => {
            let docs: Vec<&Value> = checked
                .iter()
                .filter_map(|c| c.result.as_ref().ok())
                .collect();
            report.stdout = match output {
                Output::Json => {
                    let sorted: Vec<Value> =
                        docs.iter().map(|d| catalog::sorted((*d).clone())).collect();
                    let mut s = serde_json::to_string_pretty(&sorted).unwrap_or_default();
                    s.push('\n');
                    s
                }
                Output::Text => docs
                    .iter()
                    .map(|d| {
                        catalog::to_yaml(d)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>()
                    .join("---\n"),
            };
            report.stderr = errors_text;
        }
    }
    report
}

/// Reads and checks every document of one file.
pub fn check_file(path: &PathBuf) -> Vec<Checked> {
    let file = path.display().to_string();
    let failed = |message: String| {
        let mut errors = svc_core::validation::ErrorList::default();
        errors.push("", "FileUnreadable", message);
        vec![Checked {
            label: file.clone(),
            file: file.clone(),
            document: 0,
            kind: String::new(),
            result: Err(ConfigError::new(file.clone(), errors)),
        }]
    };
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes));
    if let Err(e) = read {
        return failed(format!("cannot read: {e}"));
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return failed(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return failed("not UTF-8 text".into());
    };
    let docs = split_documents(text);
    if docs.is_empty() {
        return failed("no configuration documents".into());
    }
    let many = docs.len() > 1;
    docs.iter()
        .enumerate()
        .map(|(i, doc)| {
            let (kind, result) = check_document(doc);
            Checked {
                label: if many {
                    format!("{file}#{}", i.saturating_add(1))
                } else {
                    file.clone()
                },
                file: file.clone(),
                document: i.saturating_add(1),
                kind,
                result,
            }
        })
        .collect()
}

/// Validates and defaults one document; returns its kind (as written) with the verdict.
pub fn check_document(doc: &str) -> (String, Result<Value, ConfigError>) {
    match parse_document(doc.as_bytes()) {
        Ok(value) => {
            let (_, kind) = type_meta(&value);
            (kind, catalog::load_any(value))
        }
        Err(e) => (String::new(), Err(e)),
    }
}

/// Splits YAML at `---` lines (a JSON document is one document); documents holding nothing
/// but blanks and comments are dropped.
pub fn split_documents(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim_start().starts_with(['{', '[']) {
        return vec![text.to_string()];
    }
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.split_inclusive('\n') {
        let marker = line
            .strip_prefix("---")
            .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']));
        if let Some(rest) = marker {
            docs.push(std::mem::take(&mut current));
            // Content after the marker (`--- {a: 1}`) starts the next document.
            if !rest.trim().is_empty() {
                current.push_str(rest.trim_start_matches([' ', '\t']));
            }
        } else if line.trim_end() == "..." {
            docs.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
        }
    }
    docs.push(current);
    docs.into_iter()
        .filter(|d| {
            d.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with('#')
            })
        })
        .collect()
}

fn kind_label(c: &Checked) -> &str {
    if !c.kind.is_empty() { &c.kind } else { "-" }
}

/// `file: kind: field: message` per error (and `file: kind: valid` per valid document when
/// `with_valid`).
fn text_lines(checked: &[Checked], with_valid: bool) -> String {
    let mut out = String::new();
    for c in checked {
        match &c.result {
            Ok(_) if with_valid => {
                let _ = writeln!(out, "{}: {}: valid", c.label, kind_label(c));
            }
            Ok(_) => {}
            Err(e) => {
                for line in e.lines() {
                    // One line per error, for grep: a parser's source excerpt is left to `-o json`.
                    let line = line.lines().next().unwrap_or_default();
                    let _ = writeln!(out, "{}: {}: {line}", c.label, kind_label(c));
                }
            }
        }
    }
    out
}

/// One entry per error (`file`, `document`, `kind`, `field`, `type`, `message`,
/// `valid: false`) and one per valid document (`valid: true`).
fn json_report(checked: &[Checked]) -> String {
    let mut entries = Vec::new();
    for c in checked {
        match &c.result {
            Ok(_) => entries.push(json!({
                "file": c.file, "document": c.document, "kind": c.kind, "valid": true,
            })),
            Err(e) => {
                for cause in &e.errors.0 {
                    entries.push(json!({
                        "file": c.file, "document": c.document, "kind": c.kind,
                        "field": cause.field, "type": cause.reason, "message": cause.message,
                        "valid": false,
                    }));
                }
            }
        }
    }
    let mut s = serde_json::to_string_pretty(&entries).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_at_markers_and_empty_ones_are_dropped() {
        let docs =
            split_documents("# head\n---\na: 1\n--- \nb: 2\n---\n# only a comment\n...\nc: 3\n");
        assert_eq!(docs, ["a: 1\n", "b: 2\n", "c: 3\n"]);
        assert_eq!(split_documents("{\"a\": \"---\"}"), ["{\"a\": \"---\"}"]);
        // `---x` is content, not a marker.
        assert_eq!(split_documents("a: |\n  ---x\n"), ["a: |\n  ---x\n"]);
        assert!(split_documents("\n# nothing\n---\n").is_empty());
    }

    #[test]
    fn a_document_names_its_kind_and_errors() {
        let (kind, result) = check_document(
            "apiVersion: apiserver.svc.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: -1\n",
        );
        assert_eq!(kind, "TracingConfiguration");
        let err = result.unwrap_err();
        assert_eq!(err.errors.0[0].field, "samplingRatePerMillion");
        let (kind, result) = check_document("a: [\n");
        assert_eq!(kind, "");
        assert!(result.is_err());
    }
}
