//! `svc-gateway validate-config` as a user runs it: the real binary on the files in
//! `gateway/tests/validate/` and the golden defaults in `config/tests/config/defaults/`, checking
//! exit codes, the `file: kind: field: message` lines, `-o json` parsed back, and
//! `--print-defaults`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn files() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/validate")
}

fn golden_defaults() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/tests/config/defaults")
}

/// Runs `svc-gateway validate-config ARGS` in `dir`.
fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svc-gateway"))
        .arg("validate-config")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run svc-gateway")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn valid_files_exit_zero_and_are_listed() {
    let out = run(&files(), &["valid.yaml", "valid.json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout(&out),
        "valid.yaml#1: SvcProxyConfiguration: valid\n\
         valid.yaml#2: SvcSchedulerConfiguration: valid\n\
         valid.yaml#3: CloudControllerManagerConfiguration: valid\n\
         valid.yaml#4: TracingConfiguration: valid\n\
         valid.yaml#5: DefaultPreemptionArgs: valid\n\
         valid.json: VolumeBindingArgs: valid\n"
    );
}

#[test]
fn invalid_files_print_every_error_with_its_path_and_exit_one() {
    let out = run(&files(), &["invalid.yaml", "invalid.json"]);
    assert_eq!(out.status.code(), Some(1));
    let golden = std::fs::read_to_string(files().join("invalid.txt")).unwrap();
    assert_eq!(stdout(&out), golden);
    // One bad document among good ones still fails the run; the good ones are still listed.
    let out = run(&files(), &["valid.json", "invalid.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout(&out),
        "valid.json: VolumeBindingArgs: valid\n\
         invalid.json: InterPodAffinityArgs: hardPodAffinityWeight: Invalid value: 101: \
         not in valid range [0, 100]\n"
    );
}

#[test]
fn json_output_parses_back_with_one_entry_per_error_and_per_valid_document() {
    let out = run(&files(), &["-o", "json", "valid.json", "invalid.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        entries[0],
        serde_json::json!({"file": "valid.json", "document": 1, "kind": "VolumeBindingArgs", "valid": true})
    );
    let errors: Vec<(String, u64, String, String)> = entries[1..]
        .iter()
        .map(|e| {
            assert_eq!(e["valid"], false);
            assert!(e["message"].as_str().unwrap().len() > 5);
            (
                e["file"].as_str().unwrap().to_string(),
                e["document"].as_u64().unwrap(),
                e["kind"].as_str().unwrap().to_string(),
                e["field"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expect = |d: u64, kind: &str, field: &str| {
        (
            "invalid.yaml".to_string(),
            d,
            kind.to_string(),
            field.to_string(),
        )
    };
    assert_eq!(errors.len(), 11);
    assert_eq!(
        errors[0],
        expect(1, "SvcProxyConfiguration", "iptables.masqueradeBit")
    );
    assert_eq!(
        errors[4],
        expect(
            2,
            "SvcSchedulerConfiguration",
            "leaderElection.renewDeadline"
        )
    );
    assert_eq!(
        errors[7],
        expect(
            3,
            "SvcSchedulerConfiguration",
            "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage"
        )
    );
    assert_eq!(errors[10], expect(6, "SvcProxyConfiguration", "apiVersion"));
    assert_eq!(entries[1]["type"], "FieldValueInvalid");
    assert_eq!(entries[11]["type"], "FieldValueNotSupported");
}

#[test]
fn print_defaults_prints_the_golden_documents() {
    // Kinds whose every field may be left out: their type meta alone prints the golden file.
    let minimal = [
        "SvcProxyConfiguration",
        "SvcSchedulerConfiguration",
        "CloudControllerManagerConfiguration",
        "TracingConfiguration",
        "VolumeBindingArgs",
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(golden_defaults()).unwrap() {
        let golden_path = entry.unwrap().path();
        let golden = std::fs::read_to_string(&golden_path).unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(&golden).unwrap();
        let kind = doc["kind"].as_str().unwrap();
        if minimal.contains(&kind) {
            seen += 1;
            let head = format!(
                "apiVersion: {}\nkind: {kind}\n",
                doc["apiVersion"].as_str().unwrap()
            );
            std::fs::write(dir.path().join("in.yaml"), head).unwrap();
            let out = run(dir.path(), &["--print-defaults", "in.yaml"]);
            assert_eq!(out.status.code(), Some(0));
            assert_eq!(stdout(&out), golden, "{}", golden_path.display());
        }
        // The printed defaults are a fixed point.
        let path = golden_path.to_str().unwrap();
        let again = run(&golden_defaults(), &["--print-defaults", path]);
        assert_eq!(again.status.code(), Some(0), "{path}");
        assert_eq!(stdout(&again), golden, "{path}");
        // `-o json` prints the same documents as a JSON array.
        let out = run(
            &golden_defaults(),
            &["--print-defaults", "-o", "json", path],
        );
        let docs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(docs, [doc]);
    }
    assert_eq!(seen, minimal.len());
}

#[test]
fn print_defaults_keeps_valid_documents_and_reports_the_rest_on_stderr() {
    let out = run(
        &files(),
        &["--print-defaults", "invalid.json", "valid.json"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout(&out),
        "apiVersion: svcscheduler.config.svc.io/v1\nbindTimeoutSeconds: 300\nkind: VolumeBindingArgs\n"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("invalid.json: InterPodAffinityArgs: hardPodAffinityWeight: "),
        "{stderr}"
    );
}

#[test]
fn unreadable_empty_and_malformed_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.yaml"), "# nothing here\n---\n").unwrap();
    std::fs::write(dir.path().join("broken.yaml"), "kind: [\n").unwrap();
    std::fs::write(dir.path().join("list.yaml"), "- 1\n").unwrap();
    let out = run(
        dir.path(),
        &["missing.yaml", "empty.yaml", "broken.yaml", "list.yaml"],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("missing.yaml: -: cannot read: "),
        "{text}"
    );
    assert_eq!(lines[1], "empty.yaml: -: no configuration documents");
    assert!(lines[2].starts_with("broken.yaml: -: "), "{text}");
    assert!(
        lines[3].starts_with("list.yaml: -: Invalid value: "),
        "{text}"
    );
    // No file at all is a usage error; the server's own flags still parse without a command.
    let out = run(dir.path(), &[]);
    assert_eq!(out.status.code(), Some(2));
}
