//! The svc-gateway binary.
fn main() {}
