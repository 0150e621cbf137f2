//! Test support shared by every end-to-end module: an in-process server with a TLS HTTP client
//! (`client`), the real binary as a child process (`process`), and kubectl driven against it
//! (`kubectl`).

pub mod client;
pub mod kubectl;
pub mod process;
