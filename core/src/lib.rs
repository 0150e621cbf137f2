//! svc-core: the object model and API machinery (sans-IO).
