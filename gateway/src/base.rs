//! The first floor: what every other layer may use and that uses nothing of the gateway's own.
//! Command-line flags, feature gates, query strings, the router's path parsing, lifecycle
//! signals, saturating deadlines, single-flight calls, configuration-file reloading, `validate-config`, and giving
//! the allocator's free memory back after a load.

pub mod allocator;
pub mod annotations;
pub mod deadline;
pub mod features;
pub mod flags;
pub mod flights;
pub mod lifecycle;
pub mod query;
pub mod reload;
pub mod router;
pub mod threads;
pub mod validate_config;
pub mod verb;
