//! ivory-registry
