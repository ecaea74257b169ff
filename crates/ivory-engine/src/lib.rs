//! ivory-engine
