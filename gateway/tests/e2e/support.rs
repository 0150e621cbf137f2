//! Test support shared by every end-to-end module: an in-process server with a TLS HTTP client
//! (`client`), the real binary as a child process (`process`), kubectl driven against it
//! (`kubectl`), raw h2 frames (`h2raw`), an OIDC issuer (`oidc`), this process's threads
//! (`threads`), and the validator of watch guarantees (`watch_validator`).

pub mod client;
pub mod h2raw;
pub mod kubectl;
pub mod oidc;
pub mod process;
#[cfg(target_os = "linux")]
pub mod threads;
pub mod watch_validator;
