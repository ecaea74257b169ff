//! ivory-policy
