//! What the server tells about itself: Prometheus metrics (`/metrics`) and traces
//! (`--tracing-config-file`). Uses `base` only.

pub mod metrics;
pub mod trace;
