//! JSON Patch (RFC 6902) with JSON Pointers (RFC 6901). Errors follow Kubernetes' patch
//! handler: an undecodable patch is 400, more than 10,000 operations 413, and an operation
//! that cannot be applied (a failed `test`, a missing path, `copy`s that together copy more
//! than 3 MiB, a value placed deeper than a request body may nest) 422.

use serde_json::Value;

use crate::status::ApiError;

/// Kubernetes' `maxJSONPatchOperations`.
pub const MAX_OPERATIONS: usize = 10_000;

/// Kubernetes' `JSONPatchMaxCopyBytes`: how many bytes (of the copied values' JSON) the
/// `copy` operations of one patch may add together. Without it each `copy` of the document
/// into itself doubles it, and a few dozen operations exhaust memory.
pub const MAX_COPY_BYTES: u64 = 3 * 1024 * 1024;

/// Applies the JSON Patch document `patch` to `doc`.
pub fn apply(doc: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let ops: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let Value::Array(ops) = ops else {
        return Err(ApiError::bad_request(
            "error decoding patch: a JSON patch must be an array of operations",
        ));
    };
    if ops.len() > MAX_OPERATIONS {
        return Err(ApiError::RequestEntityTooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let ops = ops
        .iter()
        .map(Operation::decode)
        .collect::<Result<Vec<_>, String>>()
        .map_err(ApiError::bad_request)?;
    let mut out = doc.clone();
    let mut copied = 0;
    for op in &ops {
        op.apply(&mut out, &mut copied)
            .map_err(ApiError::unprocessable)?;
    }
    Ok(out)
}

/// How deep a patched document may nest: as deep as a JSON request body may (serde_json's
/// limit). Without it, `move`s and `add`s with long paths nest a document a level or a hundred
/// per operation, and the recursive code that reads, encodes and drops it overflows the stack,
/// which aborts the server.
pub const MAX_DEPTH: usize = 128;

/// How many arrays and objects `v` nests (a scalar 0), counted without recursion.
fn depth(v: &Value) -> usize {
    let mut deepest = 0usize;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        let below = d.saturating_add(1);
        deepest = deepest.max(below);
        stack.extend(children.map(|c| (c, below)));
    }
    deepest
}

/// Refuses to place `v` at `path` when the document would then nest deeper than
/// [`MAX_DEPTH`].
fn check_depth(path: &[String], v: &Value) -> Result<(), String> {
    if path.len().saturating_add(depth(v)) > MAX_DEPTH {
        return Err(format!(
            "the patched object would nest deeper than {MAX_DEPTH} levels at /{}",
            path.join("/")
        ));
    }
    Ok(())
}

/// The length of `v`'s JSON, counted without building it.
fn json_len(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len() as u64);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[derive(Debug)]
enum Op {
    Add(Value),
    Remove,
    Replace(Value),
    Move(Vec<String>),
    Copy(Vec<String>),
    Test(Value),
}

#[derive(Debug)]
struct Operation {
    op: Op,
    path: Vec<String>,
    raw_path: String,
}

impl Operation {
    fn decode(v: &Value) -> Result<Operation, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "a JSON patch operation must be an object".to_string())?;
        let kind = obj
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| "a JSON patch operation needs a string \"op\"".to_string())?;
        let raw_path = obj
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("operation {kind:?} needs a string \"path\""))?;
        let path = parse_pointer(raw_path)?;
        let value = || {
            obj.get("value")
                .cloned()
                .ok_or_else(|| format!("operation {kind:?} at {raw_path:?} needs a \"value\""))
        };
        let from = || {
            obj.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("operation {kind:?} at {raw_path:?} needs a \"from\""))
                .and_then(parse_pointer)
        };
        let op = match kind {
            "add" => Op::Add(value()?),
            "remove" => Op::Remove,
            "replace" => Op::Replace(value()?),
            "move" => Op::Move(from()?),
            "copy" => Op::Copy(from()?),
            "test" => Op::Test(value()?),
            other => return Err(format!("Unexpected kind: {other}")),
        };
        Ok(Operation {
            op,
            path,
            raw_path: raw_path.to_string(),
        })
    }

    /// Applies the operation; `copied` is the JSON size `copy` operations have added so far.
    fn apply(&self, doc: &mut Value, copied: &mut u64) -> Result<(), String> {
        let p = &self.raw_path;
        match &self.op {
            Op::Add(v) => {
                check_depth(&self.path, v)?;
                add(doc, &self.path, v.clone())
            }
            Op::Remove => remove(doc, &self.path).map(drop),
            Op::Replace(v) => {
                check_depth(&self.path, v)?;
                let target = get_mut(doc, &self.path).ok_or_else(|| {
                    format!("replace operation does not apply: doc is missing key: {p}")
                })?;
                *target = v.clone();
                Ok(())
            }
            Op::Move(from) => {
                if self.path.len() > from.len() && self.path.starts_with(from) {
                    return Err(format!("move operation cannot move {p} into its own child"));
                }
                let v = remove(doc, from)?;
                check_depth(&self.path, &v)?;
                add(doc, &self.path, v)
            }
            Op::Copy(from) => {
                let source = get_mut(doc, from).ok_or_else(|| {
                    "copy operation does not apply: doc is missing from path".to_string()
                })?;
                *copied = copied.saturating_add(json_len(source));
                if *copied > MAX_COPY_BYTES {
                    return Err(format!(
                        "Unable to complete the copy, the accumulated size increase of copy is \
                         {copied}, exceeding the limit {MAX_COPY_BYTES}"
                    ));
                }
                check_depth(&self.path, source)?;
                let v = source.clone();
                add(doc, &self.path, v)
            }
            Op::Test(expected) => match get_mut(doc, &self.path) {
                Some(actual) if actual == expected => Ok(()),
                _ => Err(format!("testing value {p} failed: test failed")),
            },
        }
    }
}

/// Splits a JSON Pointer into unescaped tokens (`~1` is `/`, `~0` is `~`).
pub fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("JSON pointer {p:?} must start with \"/\""));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// An array index token: digits only, no leading zeros (RFC 6901).
fn index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if allow_end && token == "-" {
        return Some(len);
    }
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if token.len() > 1 && token.starts_with('0') {
        return None;
    }
    let i: usize = token.parse().ok()?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    (i <= max && (allow_end || len > 0)).then_some(i)
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in path {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = index(t, a.len(), false)?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, path: &[String], v: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    let missing = || {
        format!(
            "add operation does not apply: doc is missing path: /{}",
            path.join("/")
        )
    };
    match get_mut(doc, parent).ok_or_else(missing)? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Value::Array(a) => {
            let i = index(last, a.len(), true).ok_or_else(|| {
                format!("add operation does not apply: index {last:?} out of bounds")
            })?;
            a.insert(i, v);
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let missing = || {
        format!(
            "remove operation does not apply: doc is missing path: \"/{}\"",
            path.join("/")
        )
    };
    let (last, parent) = path.split_last().ok_or_else(missing)?;
    match get_mut(doc, parent).ok_or_else(missing)? {
        Value::Object(m) => m.remove(last).ok_or_else(missing),
        Value::Array(a) => {
            let i = index(last, a.len(), false).ok_or_else(missing)?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}
