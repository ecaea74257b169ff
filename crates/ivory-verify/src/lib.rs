//! ivory-verify
